"""``answer-matches-cause``: each worker's first answer names the cause its
scheduler was given (notes/verdicts.md, "What the client is told").  The
model's finish reasons say their cause (``Finish.cause``), each answer
event carries it (``Stream.cause``), and the property compares it with
what the answering worker had seen: its intake's rejection, the client's
abort reaching it."""
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import events as ev
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply
from reqmodel.model.state import ABORT_400, ABORT_500, LENGTH, Finish, client_abort
from reqmodel.model.actions.core import set_d
from steps import RUNNING, run_steps

AMC = properties.CATALOG["answer-matches-cause"]
RELEASES = releases.NAMES


def test_each_finish_reason_says_its_cause():
    assert client_abort(503).cause == "client" and str(client_abort(503)) == (
        "FINISH_ABORT(503, the client's abort)")
    assert ABORT_400.cause == "reject" and ABORT_500.cause == "failure"
    assert LENGTH.cause == "done" and str(ABORT_500) == "FINISH_ABORT(500)"
    # on 0.5.19 the client's abort and a failure share the status 500; the
    # reason still tells them apart (the message the code builds)
    assert client_abort(500) != ABORT_500 and Finish("abort", 500) == ABORT_500


@pytest.mark.parametrize("rel", RELEASES)
def test_a_client_abort_during_prealloc_is_answered_as_a_failure(rel):
    """Decode's ``abort_request`` only calls ``receiver.abort()`` on a
    prealloc entry; the next ``pop_preallocated`` reads Failed and answers
    the failure's 500 (every release): the property breaks on that step."""
    ctx = Ctx(releases.get(rel), scenario.builtin("abort-reaches-decode"))
    pre = run_steps(ctx, (Step("d_intake", 0), Step("d_door", 0), Step("d_abort", 0)))
    step = Step("d_prealloc_drop", 0)
    post, evs = apply(ctx, pre, step)
    (answer,) = [e for e in evs if isinstance(e, ev.Stream)]
    assert (answer.status, answer.cause) == (500, "failure")
    assert pre.d[0].client_aborted
    assert AMC.hit(pre, step, evs, post)


@pytest.mark.parametrize("rel", RELEASES)
def test_a_client_abort_in_decode_s_waiting_queue_is_answered_as_the_abort(rel):
    """Method 1 (decode's waiting queue, after the commit) answers the
    abort's own verdict in the step that takes the abort."""
    ctx = Ctx(releases.get(rel), scenario.builtin("abort-reaches-decode"))
    pre = run_steps(ctx, RUNNING[:-1])
    step = Step("d_abort", 0)
    post, evs = apply(ctx, pre, step)
    (answer,) = [e for e in evs if isinstance(e, ev.Stream)]
    assert answer.cause == "client"
    assert not AMC.hit(pre, step, evs, post)


@pytest.mark.parametrize("rel", RELEASES)
def test_the_exhaustive_search_finds_it_on_both_workers(rel):
    for name, side in (("abort-reaches-decode", "decode"), ("abort-reaches-prefill", "prefill")):
        v = explore.explore(releases.get(rel), scenario.builtin(name), [AMC]).verdicts[AMC.name]
        assert v.verdict == "violated", name
        assert v.trace.steps[-1].action.startswith(side[0] + "_")


def _stream_check(pre_rejected: bool, aborted: bool, cause: str) -> bool:
    """The property's check on one decode answer of request 0 in a state
    where decode's intake did (not) reject it and the client's abort did
    (not) reach decode."""
    ctx = Ctx(releases.get("0.5.21"), scenario.builtin("abort-reaches-decode"))
    s = run_steps(ctx, (Step("d_intake", 0),))
    s = set_d(s, 0, rejected=pre_rejected, client_aborted=aborted)
    return AMC.holds_on(s, Step("d_respond", 0), (ev.Stream(0, "decode", 0, cause),), s)


@pytest.mark.parametrize("rejected,aborted,cause,ok", [
    (False, False, "done", True), (False, False, "failure", True),
    (False, False, "client", False), (False, False, "reject", False),
    (True, False, "reject", True), (True, False, "failure", False), (True, False, "done", False),
    (False, True, "client", True), (False, True, "failure", False), (False, True, "done", False),
    (True, True, "client", True), (True, True, "reject", True), (True, True, "failure", False),
])
def test_the_causes_a_worker_may_give(rejected, aborted, cause, ok):
    assert _stream_check(rejected, aborted, cause) is ok


def test_only_the_first_answer_is_judged():
    """The tokenizer manager forgets a request at its first final answer; a
    later stream_output of the same worker reaches no client."""
    ctx = Ctx(releases.get("0.5.21"), scenario.builtin("abort-reaches-decode"))
    s = run_steps(ctx, (Step("d_intake", 0),))
    s = set_d(s, 0, client_aborted=True, answer=503)
    assert AMC.holds_on(s, Step("d_respond", 0), (ev.Stream(0, "decode", 500, "failure"),), s)


@pytest.mark.parametrize("name", ["transfer-failure", "two-valid", "decode-reject"])
def test_holds_where_no_abort_or_rejection_can_happen(name):
    """Without client aborts every answer is a failure or a completion, and
    a rejection (decode-reject: at decode's door on 0.5.21+, at its
    prebuilt batch before) is answered with its 400: the property holds
    (it is not violated by every scenario)."""
    sc = scenario.builtin(name)
    assert not sc.events.client_abort and not sc.events.req_waiting_timeout
    v = explore.explore(releases.get("0.5.21"), sc, [AMC]).verdicts[AMC.name]
    assert v.verdict == "holds"


@pytest.mark.parametrize("name", ["abort-reaches-decode", "abort-reaches-prefill"])
def test_the_fix_answers_the_client_s_abort_as_the_abort(name):
    """The proposal ``abort-verdict-kept`` (0.5.23 whose ``abort_request``
    gives a handoff queue's entry the abort's own verdict, kept by the
    failure paths) makes the property hold where 0.5.23 fails it; the
    failure itself is still the next scan's (the same four steps end the
    request)."""
    from reqmodel.proposals.mutants import MUTANTS
    fixed = MUTANTS["abort-verdict-kept"]
    assert fixed.handoff_abort_keeps_verdict
    assert not any(releases.get(r).handoff_abort_keeps_verdict for r in RELEASES)
    v = explore.explore(fixed, scenario.builtin(name), [AMC]).verdicts[AMC.name]
    assert v.verdict == "holds"
    side = "d" if name.endswith("decode") else "p"
    ctx = Ctx(fixed, scenario.builtin(name))
    steps = ((Step("d_intake", 0), Step("d_door", 0), Step("d_abort", 0), Step("d_prealloc_drop", 0))
             if side == "d" else
             (Step("p_intake", 0), Step("p_door", 0), Step("p_abort", 0),
              Step("p_pop_bootstrapped", 0)))
    s = run_steps(ctx, steps)
    req = s.d[0] if side == "d" else s.p[0]
    assert req.finished_reason.cause == "client" and req.answer != 200
