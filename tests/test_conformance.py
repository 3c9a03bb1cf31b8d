"""Conformance against the real released wheels (issue #8): ``pytest -m
conformance``. Needs the environment that ``reqmodel conform --setup`` builds
(``.ci/run`` builds it); without it these tests fail, they do not skip.

One worker process per release runs the cases of every model release, so the
same real observations serve the same-release check (zero mismatches) and
the cross-release check (mismatches exactly where the releases' seam records
differ).
"""
import functools

import pytest

from reqmodel import conform
from reqmodel.model import releases
from reqmodel.conform import cases as cases_mod

pytestmark = pytest.mark.conformance
RELEASES = releases.NAMES
ROOT = conform.DEFAULT_DIR


_EXPLORED = None  # the session's shared explorations (root conftest.py)


@pytest.fixture(scope="session", autouse=True)
def _shared_explorations(explored):
    """Build the cases from the explorations the rest of the suite made, when
    it runs in the same process (.ci/run does): exploring every built-in
    scenario again was 406 of the conformance suite's 512 s."""
    global _EXPLORED
    _EXPLORED = explored


def shared_states(rel):
    """Every reachable state of a built-in scenario, from the shared
    (exhaustive) exploration."""
    return lambda name: _EXPLORED(rel, name).state_of


@functools.lru_cache(maxsize=None)
def model_cases(rel):
    return cases_mod.model_cases(releases.get(rel), 1000, states_of=shared_states(rel))


@functools.lru_cache(maxsize=None)
def real(code_rel):
    """The real code of ``code_rel`` on every model release's cases."""
    allcases = [c for m in RELEASES for c in model_cases(m)]
    answer = conform.drive(ROOT, code_rel, [c.to_worker() for c in allcases])
    out, i = {}, 0
    for m in RELEASES:
        n = len(model_cases(m))
        out[m] = {"features": answer["features"],
                  "observations": answer["observations"][i:i + n]}
        i += n
    return out


def observed_by_inputs(rel):
    """What ``rel``'s code observed on each of its own model's cases, keyed by
    the case's inputs (canonical JSON)."""
    return dict(zip((c.inputs for c in model_cases(rel)), real(rel)[rel]["observations"]))


def mismatches(code_rel, model_rel):
    return conform.compare(model_cases(model_rel), real(code_rel)[model_rel])


def seams(rel):
    """What the release record says at the seams driven (sender capacity last)."""
    r = releases.get(rel)
    return (r.prefill_door.__name__, r.decode_door.__name__, r.retire_cleanup,
            r.final_result.__name__, r.middle_result.__name__,
            r.requeue_fallback_frees_metadata, r.update_status.__name__, r.sender_capacity)


@pytest.mark.parametrize("rel", RELEASES)
def test_model_matches_the_real_code(rel):
    assert len(model_cases(rel)) >= 1000
    bad = mismatches(rel, rel)
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]}"


@pytest.mark.parametrize("code_rel,model_rel",
                         [(c, m) for c in RELEASES for m in RELEASES if c != m])
def test_cross_release_mismatches_where_the_seams_differ(code_rel, model_rel):
    bad = mismatches(code_rel, model_rel)
    door_differs = seams(code_rel)[:-1] != seams(model_rel)[:-1]
    if door_differs:
        assert bad, f"model {model_rel} on code {code_rel}: no mismatch found"
    else:
        # sender capacity (pool vs max_input_len) differs between 0.5.22 and
        # 0.5.23, but intake already cut every prompt to the limit: the two
        # agree on every case the model can reach
        assert not bad, f"model {model_rel} on code {code_rel}: {bad[0]}"


def test_every_seam_is_driven():
    for rel in RELEASES:
        seams_hit = {c.seam for c in model_cases(rel)}
        assert seams_hit == {"intake", "prefill_door", "decode_door", "prefill_result",
                             "prefill_inflight", "decode_room"}, rel


def test_the_popped_room_steps_run_on_the_real_receivers():
    """The popped-room crash (room-reuse-three, 0.5.21+; room-reuse, 0.5.19)
    rests on three facts of decode's KV manager, read here from each wheel's
    own ``CommonKVReceiver`` and ``update_status``: a new receiver of the room
    creates the entry when none is left, any receiver's ``clear()`` pops it
    whoever created it, and a receiver that has not concluded raises
    KeyError when it polls a popped entry."""
    for rel in RELEASES:
        obs = observed_by_inputs(rel)
        assert obs['{"op": "init", "prior": null}']["status"] == "WaitingForInput", rel
        assert obs['{"op": "clear", "prior": "WaitingForInput"}']["status"] is None, rel
        assert obs['{"op": "poll", "prior": null}'] == {"poll": "KeyError", "status": None}, rel


def test_a_failed_entry_keeps_a_later_receiver_failed_from_0_5_20():
    """0.5.19's ``update_status`` lets a later receiver's Bootstrapping replace
    a Failed entry; from 0.5.20 Failed is terminal: the later receiver of the
    room starts Failed (why request 1 of room-reuse-three fails at once)."""
    for rel in RELEASES:
        after = observed_by_inputs(rel)['{"op": "init", "prior": "Failed"}']["status"]
        assert after == ("WaitingForInput" if rel == "0.5.19" else "Failed"), rel


def test_the_36988_result_fix_is_a_mismatch_across_it():
    bad = [m for m in mismatches("0.5.19", "0.5.20") if m.seam == "prefill_result"]
    assert bad
    m = next(m for m in bad if m.model["kv_released"] == 1)
    assert m.real["inflight"] is True and m.real["sent"] + m.real["cached"] >= 1


def test_the_requeue_fallback_frees_metadata_from_0_5_22():
    """Found by conformance: 0.5.22 already frees the metadata buffer when an
    optimistic request falls back to the bootstrap queue (pf 22:1720)."""
    bad = [m for m in mismatches("0.5.22", "0.5.21")
           if m.seam == "prefill_result" and m.model.get("requeued") == "bootstrap"]
    assert bad and all(m.real["buffer_freed"] == 1 and m.model["buffer_freed"] == 0
                       for m in bad)


def test_the_incident_door_is_a_mismatch_across_the_fix():
    bad = mismatches("0.5.19", "0.5.21")
    doors = {m.seam for m in bad}
    assert {"prefill_door", "decode_door"} <= doors
    m = next(m for m in bad if m.seam == "prefill_door")
    assert m.model["retired"] == 1 and m.real["queued"] is True


def test_no_built_in_backend_accepts_host_destinations():
    """The model refuses ``decode_host_receive`` because decode refuses to
    start without a backend that accepts host destinations (dc 21:698-704)
    and none does.  Both facts are read from each wheel here: the host
    receive code exists exactly where the release record says, and no class
    in ``disaggregation/`` declares ``supports_host_destination`` other than
    ``False``.  A release that adds such a backend fails this test, and the
    host-staged path (dc 22:1819-1934, 22:2894-2898) then needs modelling."""
    for rel in RELEASES:
        feats = real(rel)[rel]["features"]
        record = releases.get(rel).host_destination_backends
        assert feats["decode_host_receive"] is (record is not None), rel
        assert feats["host_destination_classes"] == list(record or ()), rel


def test_decode_holds_a_failure_it_did_not_initiate_exactly_where_the_record_says():
    """``hold_unnotified`` (the field that opens the popped-room crash on
    room-reuse-three) against each wheel's source: decode's transfer queue
    calls ``ensure_abort_notified(force_arm=True)`` on a failed transfer, and
    then holds it, in the releases whose record says so and only there."""
    for rel in RELEASES:
        calls = real(rel)[rel]["features"]["force_armed_failure_calls"]
        assert bool(calls) is releases.get(rel).hold_unnotified, (rel, calls)
        assert all(c.startswith("pop_transferred:") for c in calls), (rel, calls)


def test_shared_explorations_give_the_same_cases():
    """The cases built from the suite's explorations are the ones ``reqmodel
    conform`` builds by exploring on its own, origins and order included."""
    rel = releases.get("0.5.21")
    names = ["incident", "two-rank-abort"]
    own = cases_mod.from_builtin(rel, names)
    shared = cases_mod.from_builtin(rel, names, states_of=shared_states("0.5.21"))
    assert list(own.cases.values()) == list(shared.cases.values())

