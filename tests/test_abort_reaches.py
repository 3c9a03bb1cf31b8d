"""Aborts that reach one worker (issue #23): ``[options] client_abort_reaches``
says which workers' tokenizer managers see the client's abort, and
``abort-released-without-timeout`` says that an aborted request is ended on
both workers by their own steps.  Prefill's ``sender.abort()`` tells decode
nothing, and an ABORT for a room prefill has not opened is dropped, so an
abort that reaches one worker leaves the other holding the request until a
300 s timeout.  Each test fails if the option stops reaching the guards or
the property stops telling the three apart."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import actions, properties, releases, scenario
from reqmodel.model.actions import Ctx, Step
from reqmodel.model.scenario import ScenarioError, from_dict, to_dict
from reqmodel.model.state import DStage
from steps import run_steps

RELEASED = properties.CATALOG["abort-released-without-timeout"]
ANSWERED = properties.CATALOG["answered-without-timeout"]
BASE = {"name": "a", "prompt_pages": [2], "prefill": {"pool_pages": 4},
        "decode": {"pool_pages": 4}, "events": {"client_abort": True}}
# both requests in their queues: prefill bootstrapping, decode preallocated
QUEUED = [Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0), Step("d_door", 0),
          Step("d_prealloc", 0, (0, (0, 1)))]


def _reaching(reaches):
    return from_dict({**BASE, "options": {"client_abort_reaches": reaches}})


@pytest.mark.parametrize("reaches,p,d", [("both", True, True), ("prefill", True, False),
                                          ("decode", False, True)])
def test_the_abort_is_a_step_only_on_the_workers_it_reaches(reaches, p, d):
    ctx = Ctx(releases.get("0.5.21"), _reaching(reaches))
    s = run_steps(ctx, QUEUED)
    assert actions.BY_NAME["p_abort"].enabled(ctx, s, 0) is p
    assert actions.BY_NAME["d_abort"].enabled(ctx, s, 0) is d


def test_with_both_the_second_abort_is_the_deployments_own_step():
    ctx = Ctx(releases.get("0.5.21"), _reaching("both"))
    s = run_steps(ctx, QUEUED + [Step("d_abort", 0)])
    assert actions.BY_NAME["p_abort"].own(ctx, s, 0)
    assert not actions.BY_NAME["p_abort"].own(ctx, run_steps(ctx, QUEUED), 0)


@pytest.mark.parametrize("release", releases.NAMES)
def test_an_abort_that_reaches_one_worker_leaves_the_other_to_a_timeout(release):
    rel = releases.get(release)
    props = [RELEASED, ANSWERED]
    for name in ("abort-reaches-prefill", "abort-reaches-decode"):
        res = explore.explore(rel, scenario.builtin(name), props)
        assert res.verdicts[RELEASED.name].verdict == "violated", name
        # the client has given up: nobody waits for an answer
        assert res.verdicts[ANSWERED.name].verdict == "holds", name
    both = attrs.evolve(scenario.builtin("abort-reaches-prefill"), client_abort_reaches="both")
    res = explore.explore(rel, both, props)
    assert res.verdicts[RELEASED.name].verdict == "holds"


def test_prefills_abort_leaves_decode_holding_its_pages_until_the_waiting_timeout():
    res = explore.explore(releases.get("0.5.21"), scenario.builtin("abort-reaches-prefill"),
                          [RELEASED])
    trace = res.verdicts[RELEASED.name].trace
    assert trace.steps[-1].action == "p_abort"
    last = trace.states[-1]
    assert last.d[0].stage is DStage.TRANSFER and last.d[0].pages
    assert "SGLANG_DISAGGREGATION_WAITING_TIMEOUT" in {e[2] for e in trace.ends_by}


def test_the_option_round_trips_and_is_written_only_when_not_both():
    assert "client_abort_reaches" not in to_dict(_reaching("both"))["options"]
    one = _reaching("decode")
    assert to_dict(one)["options"]["client_abort_reaches"] == "decode"
    assert from_dict(to_dict(one)) == one
    with pytest.raises(ScenarioError, match='client_abort_reaches must be "both", "prefill" or '
                                            '"decode", got \'router\''):
        _reaching("router")


def test_the_property_does_not_apply_without_client_aborts():
    sc = scenario.builtin("incident")
    assert not RELEASED.applies(releases.get("0.5.21"), sc)
