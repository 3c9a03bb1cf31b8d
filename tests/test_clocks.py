"""Timeouts as ordered clocks (``model.clocks``): a deferral hold cannot
pass while a write that was in flight when it was armed still runs, unless
MC_TRANSFER_TIMEOUT is above the deferral timeout; a trace says which
setting it needs."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.engines import symmetry
from reqmodel.model import clocks, properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply, initial_state
from reqmodel.model.actions.core import why_not
from reqmodel.model.scenario import ScenarioError

R21 = releases.get("0.5.21")
READ = properties.CATALOG["no-foreign-kv-read"]
BASE = scenario.builtin("inflight-reuse")
LONG = attrs.evolve(BASE, timeouts=((clocks.MC_TRANSFER_TIMEOUT, 300.0),))

# inflight-reuse: request 0's write is in flight when its client aborts and
# decode holds its page; the hold passes and request 1 takes the page; the
# stale write lands after request 1's own
STALE = [("p_intake", 0), ("p_intake", 1), ("d_intake", 0), ("d_intake", 1), ("p_door", 0),
         ("p_door", 1), ("d_door", 0), ("d_door", 1), ("d_prealloc", 0, (0, (0,))),
         ("p_recv_metadata", 0), ("p_pop_bootstrapped", 0), ("p_forward", 0), ("p_result", 0),
         ("xfer_dequeue", 0), ("d_abort", 0), ("p_recv_abort", 0), ("d_transferred", 0),
         ("d_deferred_timeout", 0), ("d_prealloc", 1, (0, (0,), 0)), ("p_recv_metadata", 1),
         ("p_pop_bootstrapped", 1), ("p_forward", 1), ("p_result", 1), ("xfer_dequeue", 1),
         ("xfer_write", 1), ("d_recv_status", 1), ("d_transferred", 1), ("xfer_write", 0),
         ("d_attend", 1)]
STEPS = [Step(*x) for x in STALE]
HOLD_PASSES = 18  # 1-based: the d_deferred_timeout step


def _run(sc, steps):
    ctx = Ctx(R21, sc)
    states = [initial_state(sc)]
    for i, st in enumerate(steps):
        got = apply(ctx, states[-1], st)
        if got is None:
            return ctx, states, i + 1
        states.append(got[0])
    return ctx, states, None


def test_the_hold_waits_for_a_write_in_flight_when_it_was_armed():
    ctx, states, stuck = _run(BASE, STEPS)
    assert stuck == HOLD_PASSES
    held = states[-1]
    assert held.d[0].outlasts == ((0, 0),)
    assert "hold_may_pass" in why_not(ctx, held, STEPS[HOLD_PASSES - 1])
    # the write lands (or its batch fails): the hold may pass again
    landed = apply(ctx, held, Step("xfer_write", 0))[0]
    assert landed.d[0].outlasts == ()
    assert apply(ctx, landed, Step("d_deferred_timeout", 0)) is not None


def test_with_mc_transfer_timeout_above_the_deferral_the_trace_runs_and_says_so():
    ctx, states, stuck = _run(LONG, STEPS)
    assert stuck is None
    need, = clocks.needs(ctx, states, STEPS)
    assert (need.longer, need.shorter, need.step, need.met) == (
        clocks.MC_TRANSFER_TIMEOUT, clocks.DEFERRAL_TIMEOUT, HOLD_PASSES, True)
    assert "needs MC_TRANSFER_TIMEOUT above" in str(need) and "300 s > 30 s" in str(need)
    # with the field left empty (no ordering in this deployment) the states
    # are the untimed model's
    assert all(not s.d[0].outlasts for s in states)


def test_a_write_that_starts_after_the_hold_is_not_ordered_before_it():
    """The shortest foreign read with the defaults takes its chunk after
    decode began holding (before prefill has the ABORT): nothing orders that
    write before the hold's deadline, and the trace needs no setting."""
    ex = explore.explore(R21, BASE, [READ])
    v = ex.verdicts[READ.name]
    assert v.verdict == "violated"
    steps = list(v.trace.steps)
    names = [s.action for s in steps]
    assert names.index("xfer_dequeue") > names.index("d_transferred")
    ctx, states, stuck = _run(BASE, steps)
    assert stuck is None and clocks.needs(ctx, states, steps) == []


def test_the_long_transfer_search_finds_a_path_that_needs_it():
    ex = explore.explore(R21, LONG, [READ])
    v = ex.verdicts[READ.name]
    steps = list(v.trace.steps)
    ctx, states, _ = _run(LONG, steps)
    assert [n.step for n in clocks.needs(ctx, states, steps)] == [
        steps.index(Step("d_deferred_timeout", 0)) + 1]
    # with the defaults that hold cannot pass there
    _, _, stuck = _run(BASE, steps)
    assert stuck == steps.index(Step("d_deferred_timeout", 0)) + 1


def test_symmetry_renames_the_writes_a_hold_outlasts():
    ctx, states, _ = _run(BASE, STEPS[:HOLD_PASSES - 1])
    s = states[-1]
    moved = symmetry._permute_requests(s, [1, 0])
    assert moved.d[1].outlasts == ((1, 0),) and moved.d[0].outlasts == ()
    assert symmetry._permute_requests(moved, [1, 0]) == s
    # request 0's signature names its own write, not request 1's
    sig = symmetry._request_signature(s, 0)
    assert sig == symmetry._request_signature(moved, 1)


def test_timeouts_option_round_trips_and_refuses_bad_values(tmp_path):
    data = scenario.to_dict(LONG)
    assert data["options"]["timeouts"] == {"MC_TRANSFER_TIMEOUT": 300.0}
    assert scenario.from_dict(data) == LONG
    assert "timeouts" not in scenario.to_dict(BASE)["options"]
    assert clocks.seconds(R21, LONG, clocks.MC_TRANSFER_TIMEOUT) == 300.0
    assert clocks.seconds(R21, BASE, clocks.MC_TRANSFER_TIMEOUT) == 30.0
    assert clocks.seconds(R21, BASE, clocks.DEFERRAL_TIMEOUT) == 30.0
    for bad, message in [({"MC_TIMEOUT": 1}, "not a timeout the model has"),
                         ({"MC_TRANSFER_TIMEOUT": 0}, "positive number"),
                         ({"MC_TRANSFER_TIMEOUT": True}, "positive number"),
                         ([1], "must be a table")]:
        data = scenario.to_dict(BASE)
        data["options"]["timeouts"] = bad
        with pytest.raises(ScenarioError, match=message) as exc:
            scenario.from_dict(data)
        assert "\n" not in str(exc.value)


def test_show_replay_and_report_print_what_the_trace_needs():
    import json
    import pathlib

    from click.testing import CliRunner

    from reqmodel.cli.commands import cli
    corpus = pathlib.Path(__file__).resolve().parent.parent / "counterexamples" / "0.5.21"
    long = str(corpus / "no-foreign-kv-read-inflight-reuse-long-transfer.itf.json")
    base = str(corpus / "no-foreign-kv-read-inflight-reuse.itf.json")
    shown = CliRunner().invoke(cli, ["show", long])
    assert shown.exit_code == 0, shown.output
    assert "timing: needs MC_TRANSFER_TIMEOUT above " + clocks.DEFERRAL_TIMEOUT in shown.output
    replayed = json.loads(CliRunner().invoke(cli, ["replay", long, "--json"]).output)
    assert [n["longer"] for n in replayed["timing"]] == [clocks.MC_TRANSFER_TIMEOUT]
    report = CliRunner().invoke(cli, ["show", long, "--format", "report"]).output
    assert "**Timeout setting the trace needs:** needs MC_TRANSFER_TIMEOUT" in report
    assert "timing:" not in CliRunner().invoke(cli, ["show", base]).output


def test_check_says_which_counterexamples_need_a_setting(tmp_path):
    import json

    from click.testing import CliRunner

    from reqmodel.cli.commands import cli
    args = ["check", "--release", "0.5.21", "--property", "no-foreign-kv-read", "--workers", "1"]
    got = CliRunner().invoke(cli, args + ["--scenario", "inflight-reuse-long-transfer",
                                          "--out", str(tmp_path / "a"), "--json"])
    assert got.exit_code == 0, got.output
    result, = json.loads(got.output)["results"]
    need, = result["timing"]
    assert (need["longer"], need["shorter"], need["met"]) == (
        clocks.MC_TRANSFER_TIMEOUT, clocks.DEFERRAL_TIMEOUT, True)
    text = CliRunner().invoke(cli, args + ["--scenario", "inflight-reuse-long-transfer",
                                           "--out", str(tmp_path / "b")]).output
    assert "timing: no-foreign-kv-read on inflight-reuse-long-transfer (0.5.21)" in text
    plain = CliRunner().invoke(cli, args + ["--scenario", "inflight-reuse", "--json",
                                            "--out", str(tmp_path / "c")]).output
    assert "timing" not in json.loads(plain)["results"][0]
