"""Decode's memory retraction against a write still in flight (scenario
``retract-late-write``, finding late-write-into-resumed-request).

Two things read in the wheels shape it: ``process_decode_queue`` returns
before ``pop_preallocated`` and ``pop_transferred`` while a request waits in
the retracted queue (dc 20:2769-2771, the same in every release), and the
KV checksum keeps its expected digest for a resumed request on 0.5.21/0.5.22
and clears it after the first check on 0.5.23 (dc 23:3307-3310)."""
import attrs
import pytest

from reqmodel.engines import exhaustive
from reqmodel.model import processes, properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply, enabled, initial_state
from reqmodel.model.state import DStage
from steps import run_steps

SC = scenario.builtin("retract-late-write")
P = properties.CATALOG
QUEUE_STEPS = {"d_prealloc", "d_prealloc_drop", "d_transferred", "d_unexpected_poll",
               "d_poll_popped_room"}


def foreign_read(rel, sc):
    ex = exhaustive.explore(releases.get(rel), sc, (P["no-foreign-kv-read"],), stop_early=False,
                            keep_graph=False)
    return ex.verdicts["no-foreign-kv-read"]


# request 0 committed and decoding; request 1's write in flight
BOTH_SENT = (
    Step("p_intake", 0), Step("p_intake", 1), Step("d_intake", 0), Step("d_intake", 1),
    Step("p_door", 0), Step("p_door", 1), Step("d_door", 0), Step("d_door", 1),
    Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0), Step("p_pop_bootstrapped", 0),
    Step("p_forward", 0), Step("p_result", 0), Step("xfer_dequeue", 0), Step("xfer_write", 0),
    Step("d_prealloc", 1, (0, (1,))), Step("p_recv_metadata", 1), Step("p_pop_bootstrapped", 1),
    Step("p_forward", 1), Step("p_result", 1), Step("xfer_dequeue", 1),
    Step("d_recv_status", 0), Step("d_transferred", 0), Step("d_attend", 0))


def test_no_queue_step_while_a_request_waits_retracted():
    """Request 1's abort leaves its transfer entry Failed; with request 0 in
    the retracted queue (from the retract on, its door included) decode
    neither fails the entry nor frees its page, and does once 0 resumed."""
    ctx = Ctx(releases.get("0.5.20"), SC)
    s = run_steps(ctx, BOTH_SENT + (Step("d_abort", 1), Step("d_retract", 0)))
    assert processes.retracted_queue(s) and s.d[0].stage is DStage.DOOR
    assert apply(ctx, s, Step("d_transferred", 1)) is None
    s = run_steps(ctx, (Step("d_door", 0),), s)
    assert s.d[0].stage is DStage.RETRACTED
    names = {a.name for a, _ in enabled(ctx, s)}
    assert "d_resume" in names and not QUEUE_STEPS & names
    s = run_steps(ctx, (Step("d_resume", 0, (0, (0,))),), s)
    assert not processes.retracted_queue(s)
    assert apply(ctx, s, Step("d_transferred", 1)) is not None


def test_the_resumed_request_takes_pages_freed_before_its_retraction(explored):
    """The shortest foreign read (31 steps, 0.5.19/0.5.20): the abort frees
    request 1's page before request 0 is retracted, request 0 resumes into
    it with its host backup, and request 1's write lands after."""
    v = explored("0.5.20", SC.name).verdicts["no-foreign-kv-read"]
    assert (v.verdict, v.trace_length) == ("violated", 31)
    names = [f"{st.action}({st.rid})" for st in v.trace.steps]
    assert names.index("d_transferred(1)") < names.index("d_retract(0)")
    assert names[-3:] == ["d_resume(0)", "xfer_write(1)", "d_attend(0)"]
    assert v.trace.steps[-3].arg[1] == (1,)  # request 1's page


def test_without_the_gate_the_failed_entry_is_freed_while_retracted(monkeypatch):
    """The gate is not vacuous: without it the shortest trace fails request
    1's entry while request 0 waits retracted, which no release's loop does.
    (The registry's loop gate is the one place that holds it: lifted.)"""
    monkeypatch.setattr(processes, "skipped_phases", lambda loop, s: frozenset())
    v = foreign_read("0.5.20", SC)
    names = [f"{st.action}({st.rid})" for st in v.trace.steps]
    assert v.verdict == "violated"
    assert names.index("d_retract(0)") < names.index("d_transferred(1)") < names.index(
        "d_resume(0)")


@pytest.mark.parametrize("rel, verdict", [("0.5.19", "violated"), ("0.5.20", "violated"),
                                          ("0.5.21", "violated"), ("0.5.22", "violated"),
                                          ("0.5.23", "violated")])
def test_one_prefill_instance_is_enough(explored, rel, verdict):
    """The scenario's one transfer queue: 31 steps before 0.5.21, 32 from it
    (the write outlives the 30 s deferral timeout)."""
    assert SC.transfer_queues == "shared"
    v = explored(rel, SC.name).verdicts["no-foreign-kv-read"]
    assert v.verdict == verdict
    assert v.trace_length == (31 if rel < "0.5.21" else 32)


def test_the_checksum_checks_a_resumed_request_again_only_before_0_5_23():
    """With the checksum on both roles, 0.5.21/0.5.22 verify the resumed
    request's pages against the digest kept from its commit and answer 500;
    0.5.23 verified it once, at its first batch, and reads the stale write."""
    sc = attrs.evolve(SC, name="retract-late-write-checksum",
                      prefill=attrs.evolve(SC.prefill, kv_checksum=True),
                      decode=attrs.evolve(SC.decode, kv_checksum=True))
    assert [foreign_read(rel, sc).verdict for rel in ("0.5.21", "0.5.22", "0.5.23")] == [
        "holds", "holds", "violated"]


def test_a_resumed_request_keeps_its_digest_where_the_release_does():
    sc = attrs.evolve(SC, name="x", prefill=attrs.evolve(SC.prefill, kv_checksum=True),
                      decode=attrs.evolve(SC.decode, kv_checksum=True))
    kept = {}
    for rel in ("0.5.22", "0.5.23"):
        ctx = Ctx(releases.get(rel), sc)
        s = run_steps(ctx, BOTH_SENT)  # request 0 verified at its first batch
        assert s.d[0].stage is DStage.RUNNING
        kept[rel] = s.d[0].expected_checksum is not None
    assert kept == {"0.5.22": True, "0.5.23": False}
    assert initial_state(sc).d[0].expected_checksum is None
