"""Decode's overlap scheduler (issue #23): with it, pause_generation(mode=
"retract") processes the last batch's result before it retracts, so the
client's pending abort is promoted and the request is answered, not
retracted and re-preallocated.  Each test fails if the option stops
reaching the pause, or if the pause-abort finding stops depending on it."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import actions, properties, releases, scenario
from reqmodel.model.actions import Ctx, Step
from reqmodel.model.scenario import ScenarioError, from_dict, to_dict
from steps import RUNNING, run_steps

PREALLOC = properties.CATALOG["aborted-not-preallocated"]
RESUME = properties.CATALOG["reentry-can-resume"]

# request 0 runs on decode and the client's abort has set to_finish (method 3)
ABORTED_WHILE_RUNNING = list(RUNNING) + [Step("d_abort", 0)]


@pytest.mark.parametrize("overlap", [True, False])
def test_the_pause_retracts_an_aborted_request_only_without_overlap(overlap):
    sc = attrs.evolve(scenario.builtin("pause-abort"),
                      decode=attrs.evolve(scenario.builtin("pause-abort").decode,
                                          overlap_schedule=overlap))
    ctx = Ctx(releases.get("0.5.21"), sc)
    s = run_steps(ctx, ABORTED_WHILE_RUNNING)
    assert s.d[0].to_finish is not None
    assert actions.BY_NAME["d_pause_retract"].enabled(ctx, s, 0) is not overlap
    # either way the decode step may answer the abort
    assert actions.BY_NAME["d_respond"].enabled(ctx, s, 0)


@pytest.mark.parametrize("release", releases.NAMES)
def test_aborted_not_preallocated_depends_on_decode_overlap(release):
    rel = releases.get(release)
    without = explore.explore(rel, scenario.builtin("pause-abort"), [PREALLOC, RESUME])
    with_ = explore.explore(rel, scenario.builtin("pause-abort-overlap"), [PREALLOC, RESUME])
    assert without.verdicts[PREALLOC.name].verdict == "violated"
    assert with_.verdicts[PREALLOC.name].verdict == "holds"
    # the guard does not block the pause itself: a request that was not
    # aborted is still retracted and comes back
    assert with_.verdicts[RESUME.name].verdict == "holds"  # reached


def test_the_built_in_scenarios_say_which_value_they_need():
    assert scenario.builtin("pause-abort").decode.overlap_schedule is False
    assert scenario.builtin("pause-abort-overlap").decode.overlap_schedule is True
    # SGLang's default, and every other built-in keeps it
    assert all(scenario.builtin(n).decode.overlap_schedule for n in scenario.builtin_names()
               if n != "pause-abort")


BASE = {"name": "o", "prompt_pages": [1], "prefill": {"pool_pages": 2}, "decode": {"pool_pages": 2}}


def test_the_option_round_trips_and_is_written_only_when_off():
    on = from_dict(BASE)
    off = from_dict({**BASE, "decode": {"pool_pages": 2, "overlap_schedule": False}})
    assert "overlap_schedule" not in to_dict(on)["decode"]
    assert to_dict(off)["decode"]["overlap_schedule"] is False
    assert from_dict(to_dict(off)) == off


@pytest.mark.parametrize("table,message", [
    ({"prefill": {"pool_pages": 2, "overlap_schedule": False}}, "[prefill] overlap_schedule = false is not modelled"),
    ({"decode": {"pool_pages": 2, "overlap_schedule": "off"}}, "overlap_schedule"),
    ({"options": {"overlap_schedule": False}}, "overlap_schedule"),
])
def test_refused_values_name_the_key(table, message):
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_dict({**BASE, **table})
