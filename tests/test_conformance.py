"""Conformance against the real released wheels (issue #8): ``pytest -m
conformance``. Needs the environment that ``reqmodel conform --setup`` builds
(``.ci/run`` builds it); without it these tests fail, they do not skip.

One worker process per release runs the cases of every model release, so the
same real observations serve the same-release check (zero mismatches) and
the cross-release check (mismatches exactly where the releases' seam records
differ); an input that several model releases share is driven once.
"""
import functools
import json

import pytest

from reqmodel import conform
from reqmodel.model import releases
from reqmodel.conform import cases as cases_mod
from reqmodel.conform import traces as traces_mod

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
    (exhaustive) exploration.  Under xdist the shared copies leave the states
    out (root conftest.py): the states are then explored here."""
    def states_of(name):
        kept = _EXPLORED(rel, name).state_of
        return kept if kept is not None else cases_mod.reachable_states(releases.get(rel), name)
    return states_of


@functools.lru_cache(maxsize=None)
def model_cases(rel):
    return cases_mod.model_cases(releases.get(rel), 1000, states_of=shared_states(rel))


@functools.lru_cache(maxsize=None)
def real(code_rel):
    """The real code of ``code_rel`` on every model release's cases.  Most
    inputs are cases of several model releases (the same state of the same
    scenario): each distinct (seam, inputs) is driven once, since a case
    builds its real objects afresh from its inputs
    (``test_a_case_driven_twice_is_observed_the_same``)."""
    unique = {}
    for m in RELEASES:
        for c in model_cases(m):
            unique.setdefault((c.seam, c.inputs), c)
    answer = conform.drive(ROOT, code_rel, [c.to_worker() for c in unique.values()])
    seen = dict(zip(unique, answer["observations"]))
    return {m: {"features": answer["features"],
                "observations": [seen[(c.seam, c.inputs)] for c in model_cases(m)]}
            for m in RELEASES}


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
            r.requeue_fallback_frees_metadata, r.update_status.__name__,
            r.handshake_polls_waiting, r.release_reduced, r.sender_capacity)


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


def test_a_case_driven_twice_is_observed_the_same():
    """What ``real`` relies on to drive an input once for every model release
    that has it: a case's observation depends on its inputs alone, not on
    the cases driven before it in the same worker.  Up to 20 cases of every
    seam, driven forwards then backwards in one worker."""
    per_seam = {}
    for c in model_cases("0.5.21"):
        per_seam.setdefault(c.seam, [])
        if len(per_seam[c.seam]) < 20:
            per_seam[c.seam].append(c)
    sample = [c for cs in per_seam.values() for c in cs]
    both = sample + sample[::-1]
    seen = conform.drive(ROOT, "0.5.21", [c.to_worker() for c in both])["observations"]
    n = len(sample)
    assert len(per_seam) >= 11 and n > 150
    assert seen[:n] == seen[n:][::-1]


def test_every_seam_is_driven():
    for rel in RELEASES:
        seams_hit = {c.seam for c in model_cases(rel)}
        assert seams_hit == {"intake", "prefill_door", "decode_door", "prefill_result",
                             "prefill_inflight", "decode_room", "status_merge",
                             "abort_ack", "decode_prealloc", "decode_commit",
                             "deferred_release"}, rel


SEAM_FIELDS = {
    # what each issue-#24 seam's cases read of the release record
    "decode_prealloc": lambda r: (r.handshake_polls_waiting, r.prealloc_scan.__name__),
    "decode_commit": lambda r: (r.hold_unnotified,),
    # every decode rank at once: 0.5.23 MIN-reduces readiness over them
    "deferred_release": lambda r: (r.release_reduced,),
    # the seeded record's ack targets are read back too: 0.5.21's fan-out
    # snapshot has no place in 0.5.20's one target
    "status_merge": lambda r: (r.update_status.__name__, r.conclude_transfer,
                               r.new_room_drops_acks, r.ack_targets.name),
    "abort_ack": lambda r: (r.ack_targets.name, r.ack_generations, r.clear_drops_ack_target,
                            r.new_room_drops_acks),
}


@pytest.mark.parametrize("rel", RELEASES)
def test_every_kv_manager_operation_has_a_hundred_cases(rel):
    """At least 100 distinct model cases per KV-manager seam, and every
    operation of each seam among them, on prefill and on decode."""
    kv = ("status_merge", "abort_ack")
    got = [c for c in model_cases(rel) if c.seam in kv]
    for seam in kv:
        assert sum(c.seam == seam for c in got) >= 100, (rel, seam)
    ops = {(c.seam, c.to_worker()["op"]) for c in got}
    assert ops >= {("status_merge", op) for op in ("update", "conclude", "abort", "report")}
    assert ops >= {("abort_ack", op) for op in ("abort_notification", "register", "drain",
                                                "clear", "failure_exception", "arm", "ack",
                                                "safe", "clear_tracker")}


@pytest.mark.parametrize("seam", sorted(SEAM_FIELDS))
def test_new_seams_mismatch_across_releases_exactly_where_the_records_differ(seam):
    """Two releases' models on each other's code: a mismatch at the seam in
    at least one direction if and only if the record fields its cases read
    differ (one direction can be silent where one release's records are a
    special case of the other's: 0.5.20's one ack target is a fan-out
    without peers)."""
    for i, a in enumerate(RELEASES):
        for b in RELEASES[i + 1:]:
            bad = [m for m in mismatches(a, b) + mismatches(b, a) if m.seam == seam]
            differ = SEAM_FIELDS[seam](releases.get(a)) != SEAM_FIELDS[seam](releases.get(b))
            assert bool(bad) is differ, (seam, a, b, bad[:1])


def test_conclude_records_the_failure_it_reports_from_0_5_20():
    """Found while building the status-merge seam: ``conclude_transfer``
    turns the Success of a room already Failed into Failed and makes its
    failure record (``failure_records.setdefault``, cc 20:541-547).  0.5.19's
    worker calls ``update_status(room, Success)``, whose ``max()`` promotes
    the Failed room back to Success (cc 19:375-380)."""
    for rel in RELEASES:
        obs = observed_by_inputs(rel)
        hits = [obs[c.inputs] for c in model_cases(rel) if c.seam == "status_merge"
                and _concludes_a_failed_room_without_record(c.to_worker())]
        assert hits, rel
        for got in hits:
            if rel == "0.5.19":
                assert got["status"] == "Success" and not got["failure_record"], got
            else:
                assert got["status"] == "Failed" and got["failure_record"], (rel, got)
                assert got["reports"] == ["Failed"], (rel, got)


def _prealloc_outcome(expect: dict) -> str:
    return expect["crash"] or ("drop" if 0 in expect["dropped"]
                               else "prealloc" if expect["preallocated"] else "waits")


@pytest.mark.parametrize("rel", RELEASES)
def test_decode_prealloc_has_a_hundred_cases_on_every_branch(rel):
    """pop_preallocated on the whole queue: the first entry preallocated,
    dropped by the abort scan, left waiting, or the handshake raising
    ValueError on a Success poll; from 0.5.20 also a popped room's KeyError
    (0.5.19 skips the handshake's poll while every entry waits, so its
    KeyError needs an entry that stopped waiting)."""
    got = [(json.loads(c.inputs), json.loads(c.expect)) for c in model_cases(rel)
           if c.seam == "decode_prealloc"]
    assert len(got) >= 100, (rel, len(got))
    kinds = {_prealloc_outcome(e) for _, e in got}
    assert kinds >= {"prealloc", "drop", "waits", "ValueError"}, (rel, kinds)
    if rel == "0.5.19":
        # the handshake polls (and meets a popped room) only once some entry
        # has stopped waiting
        assert all(any(not x["waiting"] for x in i["entries"])
                   for i, e in got if _prealloc_outcome(e) == "KeyError"), rel
    else:
        assert "KeyError" in kinds, (rel, kinds)
    assert any(len(i["entries"]) > 1 for i, _ in got), rel


def test_no_prealloc_case_while_a_request_waits_retracted():
    """process_decode_queue returns before pop_preallocated while the
    retracted queue is not empty (dc 20:2769-2771), so the seam has no case
    with a retracted request (issue #27's seventh step). The real budget's
    hold for retracted requests (_allocatable_token_budgets(count_retracted=
    True), which the seam found) is thereby 0 wherever the model scans; it
    matters on the pipeline-parallel loop, which is not modelled."""
    got = [json.loads(c.inputs) for rel in RELEASES for c in model_cases(rel)
           if c.seam == "decode_prealloc"]
    assert len(got) >= 100
    assert not any(i["retracted"] for i in got)


@pytest.mark.parametrize("rel", RELEASES)
def test_decode_commit_has_a_hundred_cases_on_every_branch(rel):
    """pop_transferred's branches the model reaches: a commit, a room
    mismatch, a Failed poll released at once and one held, and an entry the
    metadata gate keeps waiting."""
    got = [(json.loads(c.inputs), json.loads(c.expect)) for c in model_cases(rel)
           if c.seam == "decode_commit"]
    assert len(got) >= 100, (rel, len(got))
    kinds = {("commit" if e["transferred"] else "held" if e["held"]
              else "released" if e["kv_released"] else "waits") for _, e in got}
    assert kinds == {"commit", "held", "released", "waits"}, (rel, kinds)
    assert any(i["slot_room"] == "other" for i, _ in got), rel


def test_a_failed_poll_clears_the_room_entry_before_any_hold():
    """Found by the decode-commit seam: ``pop_transferred`` calls the
    receiver's ``failure_exception()`` on a Failed poll, whose ``clear()``
    pops ``request_status[room]`` at once, also when the request is then
    held for its drain ack (every release; the model cleared it only at the
    release, so a later user of the room inherited Failed)."""
    for rel in RELEASES:
        obs = observed_by_inputs(rel)
        held = [obs[c.inputs] for c in model_cases(rel)
                if c.seam == "decode_commit" and json.loads(c.expect)["held"]]
        assert held, rel
        assert all(o["held"] and o["receiver_cleared"] for o in held), rel


@pytest.mark.parametrize("rel", RELEASES)
def test_deferred_release_has_a_hundred_cases_and_both_ends(rel):
    """A hold ended by its drain ack (the tracker as a counted ack leaves
    it), one kept, and one ended by the deadline, and among the releases one
    that pops an entry the room's next receiver created
    (held-release-pops-next-room)."""
    got = [(json.loads(c.inputs), json.loads(c.expect)) for c in model_cases(rel)
           if c.seam == "deferred_release"]
    assert len(got) >= 100, (rel, len(got))
    held = lambda e: any(k["held"] for k in e["ranks"])  # noqa: E731
    assert any(not i["expired"] and not held(e) for i, e in got), rel
    assert any(not i["expired"] and held(e) for i, e in got), rel
    assert all(not held(e) for i, e in got if i["expired"]), rel
    assert any(i["status"] is not None and not held(e) and e["ranks"][0]["status"] is None
               for i, e in got), rel


def test_decode_ranks_release_a_hold_together_from_0_5_23():
    """The deferred release on every decode rank at once (the ranks as
    threads, 0.5.23's all_reduce_flags the real call on each): a hold that
    one rank's drain ack makes safe ends on that rank alone up to 0.5.22
    and on no rank on 0.5.23, in the model's cases and on the real code."""
    split = {}
    for rel in RELEASES:
        obs = observed_by_inputs(rel)
        for c in model_cases(rel):
            if c.seam != "deferred_release" or len(json.loads(c.inputs)["held"]) < 2:
                continue
            got = [k["held"] for k in obs[c.inputs]["ranks"]]
            split.setdefault(rel, set()).add(len(set(got)) > 1)
    assert set(split) == set(RELEASES), split
    assert split["0.5.23"] == {False}, split
    assert any(True in split[rel] for rel in RELEASES if rel != "0.5.23"), split


def _concludes_a_failed_room_without_record(case):
    room = case["room"]
    return (case["op"] == "conclude" and case["status"] == "Success"
            and room["status"] == "Failed" and not room["failure_record"])


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



# ----------------------------------------------- whole traces (conform --trace)

INCIDENT = "counterexamples/0.5.19/no-foreign-kv-read-incident.itf.json"


@functools.lru_cache(maxsize=None)
def incident_on(rel):
    from reqmodel.conform import traces
    return traces.run(ROOT, [INCIDENT], releases.get(rel))[0]


def test_the_incident_reproduces_on_the_real_0_5_19_code():
    """All 29 steps on one set of real objects, and decode's attended pages
    hold request 1's bytes, moved there by Mooncake's own send_kvcache."""
    got = incident_on("0.5.19")
    assert got.reproduced and got.divergence is None
    assert got.replayed == got.steps == 29


@pytest.mark.parametrize("rel,step,action", [("0.5.20", 24, "p_result"),
                                             ("0.5.21", 5, "p_door"),
                                             ("0.5.22", 5, "p_door"),
                                             ("0.5.23", 5, "p_door")])
def test_the_incident_diverges_where_each_fix_landed(rel, step, action):
    """0.5.20 retires the stub when its result comes back; from 0.5.21 the
    door retires it: the real request is gone, answered with an error, where the
    0.5.19 model keeps it."""
    got = incident_on(rel)
    assert not got.reproduced
    d = got.divergence
    assert (d["why"], d["step"], d["action"], d["rid"]) == ("state", step, action, 0)
    assert d["differs"]["p[0].stage"]["real"] == "gone"
    assert d["differs"]["p[0].answer"] == {"model": None, "real": "error"}


@functools.lru_cache(maxsize=None)
def corpus_on_own_release():
    import glob
    from reqmodel.conform import traces
    return traces.run(ROOT, sorted(glob.glob("counterexamples/0.5.*/*.itf.json")))


def test_no_corpus_trace_departs_from_its_own_release_code():
    """Every corpus trace, on its own release's code with its defaults: each
    step the rig drives agrees with the model; a trace reproduces, agrees to
    the end (violation not read), or stops where the rig drives nothing.
    (Before the model had Mooncake's failed-session list, nine traces
    departed here: the next request's chunk failed early on the real code.)"""
    results = corpus_on_own_release()
    bad = {(r.release, r.trace): r.divergence for r in results
           if r.divergence and r.divergence["why"] not in ("not-driven", "unread")}
    assert bad == {}
    assert sum(r.reproduced for r in results) >= 290


MULTI_RANK = ("-prefill-tp", "-rank-admission", "-two-rank-abort")


def test_several_ranks_replay_on_the_real_code():
    """Prefill TP 2 below one decode rank, and decode TP 2 below one prefill
    rank: each rank its own pool (its heads), KV manager, queues and Req,
    the ranks' all-reduces meeting as threads, decode's pages written head
    by head through the real head-sliced transfer.  At least 90 % of the
    multi-rank corpus traces reproduce, the others depart where the notes
    say; the per-rank properties are read on the real ranks: each prefill
    rank's reports on decode's tracker (commit-after-all-ranks), each
    decode rank's own pools splitting an admission (ranks-stay-in-step),
    each decode rank's drain acks."""
    results = [r for r in corpus_on_own_release()
               if any(name in r.trace for name in MULTI_RANK)]
    assert len(results) >= 85
    departed = {(r.release, r.trace) for r in results if not r.reproduced}
    assert departed == set()
    assert sum(r.reproduced for r in results) >= 0.9 * len(results)
    for prop in ("commit-after-all-ranks", "ranks-stay-in-step", "drain-ack-reaches-every-rank"):
        assert any(r.reproduced for r in results if f"/{prop}-" in r.trace), prop
    assert all(r.reproduced for r in results if "-rank-admission" in r.trace
               or "-two-rank-abort" in r.trace)


_COLLECTIVE = """
import shims; shims.install()
import adapter, rigparts
from adapter import du

def meets(k):
    return du._all_reduce_polls([3, 1] if k == 0 else [2, 4], None)

print("min", rigparts.run_ranks([lambda: meets(0), lambda: meets(1)]))
for name, calls in (("no-show", [lambda: meets(0), lambda: None]),
                    ("sizes", [lambda: meets(0), lambda: du._all_reduce_polls([1], None)])):
    try:
        rigparts.run_ranks(calls)
        print(name, "met")
    except rigparts.Unmet as e:
        print(name, "unmet", e)
    except RuntimeError as e:
        print(name, "error", e)
"""


def test_the_ranks_collective_reduces_and_reports_a_rank_that_does_not_come():
    """The rig's stand-in for gloo: the ranks' polls come back as their MIN;
    a rank that returns without entering the collective leaves its peer
    reported as not met (the hang the model's split claims), not waiting;
    unequal lengths fail."""
    import os
    import subprocess
    env = dict(os.environ, PYTHONNOUSERSITE="1", PYTHONPATH=os.pathsep.join(
        [str(conform.tree(ROOT, "0.5.21")), str(conform.HERE)]))
    out = subprocess.run([str(conform.python(ROOT)), "-c", _COLLECTIVE], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    got = {line.split()[0]: line.split(None, 1)[1] for line in out
           if line.split()[:1] and line.split()[0] in ("min", "no-show", "sizes")}
    assert got["min"] == "[[2, 1], [2, 1]]"
    assert got["no-show"].startswith("unmet")
    assert got["sizes"].startswith("error all-reduce sizes differ")


def test_with_the_failed_session_probe_the_late_write_reproduces():
    """With the probe on (transfer-failure-probe) the real probe pass takes
    decode's session off the failed list, and the late write of the failed
    batch lands in the page the next request attends over, on 0.5.19-0.5.21."""
    probe = [r for r in corpus_on_own_release()
             if r.trace.endswith("/no-foreign-kv-read-transfer-failure-probe.itf.json")]
    assert {r.release for r in probe} == {"0.5.19", "0.5.20", "0.5.21"}
    assert all(r.reproduced for r in probe), [(r.trace, r.divergence) for r in probe]


def test_every_no_foreign_kv_read_trace_the_rig_drives_reproduces():
    results = [r for r in corpus_on_own_release() if "/no-foreign-kv-read-" in r.trace]
    driven = [r for r in results if r.divergence is None or r.divergence["why"] != "not-driven"]
    assert len(driven) >= 5
    assert all(r.reproduced for r in driven), [r.trace for r in driven if not r.reproduced]


def _settle_after(rel, steps):
    from reqmodel.conform import traces
    prep = traces.prepare(INCIDENT, releases.get(rel))
    request = dict(prep.request, settle=True,
                   steps=[{"action": a, "rid": r, "params": {}} for a, r in steps])
    answer = conform.drive_traces(ROOT, rel, [request])[0]
    assert answer["stop"] is None
    return answer["final"]["settled"]


def test_settling_answers_a_valid_request_end_to_end_on_the_real_code():
    """The liveness reading is not vacuous: left to their own steps, the real
    workers take a valid request from intake to both answers, and its KV
    lands in decode's page."""
    got = _settle_after("0.5.23", [("p_intake", 1), ("d_intake", 1)])
    assert got["quiet"] and got["crash"] is None
    p, d = got["observation"]["p"][1], got["observation"]["d"][1]
    assert (p["stage"], p["answer"], d["stage"], d["answer"]) == ("gone", "ok", "gone", "ok")
    assert got["observation"]["writers"][0] == 1


def test_a_prompt_prefill_rejects_leaves_decode_waiting_from_0_5_21():
    """The door fix ends the stub on prefill; decode, which admitted the
    prompt, holds its pages waiting for a transfer that never comes (the
    answered-without-timeout finding on 0.5.21+), on the real code."""
    got = _settle_after("0.5.23", [("p_intake", 0), ("d_intake", 0)])
    assert got["quiet"] and got["crash"] is None
    p, d = got["observation"]["p"][0], got["observation"]["d"][0]
    assert (p["stage"], p["answer"]) == ("gone", "error")
    assert d["stage"] == "transfer" and d["answer"] is None and d["pages"]


def test_conform_trace_json_names_the_divergence_side_by_side():
    from click.testing import CliRunner
    from reqmodel.cli.commands import cli
    res = CliRunner().invoke(cli, ["conform", "--trace", INCIDENT, "--release", "0.5.19,0.5.21",
                                   "--json"])
    assert res.exit_code == 0, res.output
    got = {r["release"]: r for r in json.loads(res.output)["results"]}
    assert set(got) == {"0.5.19", "0.5.21"}
    assert got["0.5.19"]["reproduced"] and got["0.5.19"]["steps"] == 29
    div = got["0.5.21"]["divergence"]
    assert (div["step"], div["action"]) == (5, "p_door")
    assert div["differs"]["p[0].stage"] == {"model": "bootstrap", "real": "gone"}
    # without --release, the trace runs on its own release's code
    res = CliRunner().invoke(cli, ["conform", "--trace", INCIDENT, "--json"])
    assert [r["release"] for r in json.loads(res.output)["results"]] == ["0.5.19"]


def test_the_corpus_table_in_the_notes_is_current():
    """notes/conformance.md accounts for every corpus trace, as replayed now
    (python tools/trace_table.py rewrites it)."""
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path("tools").resolve()))
    import trace_table
    results = corpus_on_own_release()
    assert len(results) == len(list(pathlib.Path("counterexamples").glob("0.5.*/*.itf.json")))
    assert trace_table.section(trace_table.NOTES.read_text()) == trace_table.table(results)
