"""``reqmodel conform --trace``: replay a whole counterexample on the real
code and say whether the real code reaches the same violation.

The model side: the trace's states (replayed on the model of the trace's own
release) projected onto what the rig (``tracerig.py``, in the worker) can
observe on the real objects after each step; the first step whose
projections differ is the divergence, shown side by side.  ``reproduced``
means every step was taken by the real code with the model's observable
effects, up to and including the violating step, and the violation holds
on the real objects (for ``no-foreign-kv-read``: a page decode attended
over holds another request's bytes).
"""
from __future__ import annotations

import pathlib
from typing import Any, Dict, List, Optional

import attrs

from reqmodel.conform import drive_traces
from reqmodel.model.actions import kvmanager
from reqmodel.model.actions.core import Ctx
from reqmodel.model.releases import Release
from reqmodel.model.state import causes_told, DStage, KVPoll, PStage

PAGE = 16
_P_STAGES = {PStage.ABSENT: "absent", PStage.DOOR: "door", PStage.BOOTSTRAP: "bootstrap",
             PStage.WAITING: "waiting", PStage.FORWARDED: "forwarded",
             PStage.INFLIGHT: "inflight", PStage.GONE: "gone", PStage.CHUNKED: "chunked",
             PStage.YIELDED: "yielded"}
_D_STAGES = {DStage.ABSENT: "absent", DStage.DOOR: "door", DStage.PREALLOC: "prealloc",
             DStage.TRANSFER: "transfer", DStage.WAITING: "waiting", DStage.RUNNING: "running",
             DStage.RETRACTED: "retracted", DStage.HELD: "held", DStage.GONE: "gone"}


def _kind(f) -> Optional[str]:
    return None if f is None else f.kind


def _poll(p) -> Optional[str]:
    return None if p is None else p.name


def _answer(status: Optional[int]) -> Optional[str]:
    return None if status is None else "ok" if status == 200 else "error"


def project(state, decode_ranks: int = 1) -> Dict[str, Any]:
    """What the rig observes, as the model's state says it."""
    out: Dict[str, Any] = {"p": [], "d": [], "p_room": [], "d_room": [], "p_drain": []}
    ranks = state.prefill_ranks
    if decode_ranks > 1:
        out["d_ranks"] = [_decode_rank_stages(d, decode_ranks) for d in state.d]
    for r, (p, d) in enumerate(zip(state.p, state.d)):
        out["p"].append({"stage": _P_STAGES[p.stage], "to_finish": _kind(p.to_finish),
                         "finished": _kind(p.finished_reason), "answer": _answer(p.answer),
                         "rejected": p.rejected, "session": p.session_slot,
                         "crashed": p.crashed})
        out["d"].append({"stage": _D_STAGES[d.stage], "to_finish": _kind(d.to_finish),
                         "finished": _kind(d.finished_reason), "pages": list(d.pages),
                         "answer": _answer(d.answer), "rejected": d.rejected,
                         "session": d.session_slot, "crashed": d.crashed,
                         "latched": (_latched(d) if kvmanager.room_shared_on_decode(None, state, r)
                                     else None)})
        # with several prefill ranks: each rank's entry, and each rank's
        # heads of every decode page
        mine = [state.rooms[state.room_index(r, q)] for q in range(ranks)]
        rooms = [_poll(x.status) for x in mine]
        out["p_room"].append(rooms[0] if ranks == 1 else rooms)
        # what the drain ack waits on: chunks counted outstanding, the poison
        drain = [[x.outstanding, x.poisoned] for x in mine]
        out["p_drain"].append(drain[0] if ranks == 1 else drain)
        out["d_room"].append(_poll(state.d_rooms[state.room_slot(r)].status))
    out["writers"] = [pg.writer if ranks == 1 else list(pg.writers) for pg in state.d_pages]
    return out


def _latched(d) -> Optional[str]:
    """A transfer-queue entry's receiver's ``conclude_state``: the Success or
    Failed a poll latched (read for the transfer queue only, where a latch
    outlives the room's entry, and only where another request of the room
    has a receiver, ``kvmanager.room_shared_on_decode``: the model follows a
    latch only there)."""
    if d.stage is DStage.TRANSFER and d.has_receiver and d.receiver_state in (
            KVPoll.Success, KVPoll.Failed):
        return d.receiver_state.name
    return None


def _decode_rank_stages(d, ranks: int) -> List[str]:
    """Each decode rank's stage of the request, from the model's one picture
    of the ranks: a rank that let a held request go alone (up to 0.5.22) has
    it gone, and the ranks that took a split admission have it in their
    transfer queues."""
    def stage(k: int) -> str:
        if d.stage is DStage.HELD and k in d.released_on:
            return "gone"
        if k in d.split:
            return "transfer"
        return _D_STAGES[d.stage]
    return [stage(k) for k in range(ranks)]


def unsupported(loaded) -> Optional[str]:
    """Why the rig cannot stand for this trace's configuration, or None."""
    sc = loaded.scenario
    if sc.prefill.chunk_pages:
        return "chunked prefill"
    if sc.prefill.kv_checksum or sc.decode.kv_checksum:
        return "KV checksums"
    if sc.decode.radix_cache:
        return "decode's radix cache"
    if sc.hybrid_mamba:
        return "hybrid Mamba state"
    if sc.optimistic_prefill_attempts:
        return "optimistic prefill"
    if sc.transfer_queues != "shared":
        return "one transfer queue per request (several prefill instances)"
    if sc.result_timing != "loop":
        return f"result timing {sc.result_timing}"
    return None


def config(loaded, real: Release) -> Dict[str, Any]:
    from reqmodel.conform.cases import tokens
    sc = loaded.scenario
    s0 = loaded_initial(loaded)
    return {
        "n": sc.n,
        "tokens": [tokens(p) for p in sc.prompt_pages],
        "room_of": [s0.room_slot(r) for r in range(sc.n)],
        "deferred": Ctx(real, sc).deferred,
        "sessions": sc.sessions,
        "prefill": {"pool_pages": sc.prefill.pool_pages,
                    "intake_limit_pages": sc.prefill.intake_limit_pages,
                    "auto_truncate": sc.prefill.auto_truncate,
                    "metadata_buffers": sc.prefill.metadata_buffers,
                    "ranks": sc.prefill.ranks},
        "decode": {"pool_pages": sc.decode.pool_pages,
                   "intake_limit_pages": sc.decode.intake_limit_pages,
                   "auto_truncate": sc.decode.auto_truncate,
                   "metadata_buffers": sc.decode.metadata_buffers,
                   "ranks": sc.decode.ranks},
    }


def loaded_initial(loaded):
    from reqmodel.model.actions import initial_state
    return initial_state(loaded.scenario)


@attrs.frozen
class Result:
    release: str
    trace: str
    steps: int
    replayed: int  # steps the real code took with the model's effects
    reproduced: bool
    divergence: Optional[dict]

    def as_json(self) -> dict:
        return {"release": self.release, "trace": self.trace, "steps": self.steps,
                "replayed": self.replayed, "reproduced": self.reproduced,
                "divergence": self.divergence}


def _diff(model: dict, real: dict) -> Dict[str, Any]:
    """The parts of two projections that differ, side by side."""
    out = {}
    for key in model:
        if isinstance(model[key], list) and key in ("p", "d"):
            for r, (m, x) in enumerate(zip(model[key], real[key])):
                for f in m:
                    if m[f] != x.get(f):
                        out[f"{key}[{r}].{f}"] = {"model": m[f], "real": x.get(f)}
        elif model[key] != real.get(key):
            out[key] = {"model": model[key], "real": real.get(key)}
    return out


@attrs.frozen
class Prepared:
    path: str
    loaded: Any
    real: Release
    model: List[dict]  # the projection of each state
    request: Optional[dict]  # what the worker replays; None: not replayable
    why_not: Optional[str]
    # each step's scan, when it is an entry of one (``_scan_of``)
    scans: List[Optional[tuple]] = attrs.field(factory=list)


# the phases of the scheduler loops that scan a queue in one call: the code's
# call polls every entry of its queue at once (one poll all-reduce; for
# decode's prealloc queue, the handshake's prepare_abort on every Failed
# entry), where the model takes the entries one step each
# (``processes``; notes/conformance.md, "A scan's entries")
SCAN_PHASES = ("bootstrap", "inflight", "prealloc", "transfer")


def _scan_of(state, step) -> Optional[tuple]:
    """(loop, phase) of the scan ``step`` is an entry of, or None."""
    from reqmodel.model import processes
    loop = processes.loop_of(step.action)
    phase = processes.phase_of(step.action, state, step.rid)
    return (loop.name, phase) if loop is not None and phase in SCAN_PHASES else None


def _scan_end(prep: "Prepared", i: int) -> int:
    """The last state of the run of consecutive entries of one scan that
    starts with step i (i itself when step i is no scan's entry)."""
    scan = prep.scans[i - 1] if 0 < i <= len(prep.scans) else None
    j = i
    while scan is not None and j < len(prep.scans) and prep.scans[j] == scan:
        j += 1
    return j


def prepare(path: str, release: Optional[Release] = None) -> Prepared:
    """Load a trace, replay it on the model, and build the worker's request."""
    from reqmodel.traces import replay as trace_replay
    loaded = trace_replay.load(path)
    real = release or loaded.release
    why = unsupported(loaded)
    if why is not None:
        return Prepared(str(path), loaded, real, [], None, why)
    states, _events, _stopped = _model_states(loaded)
    request = {"config": config(loaded, real),
               "settle": ("timed" if loaded.property.name in TIMED
                          else "own" if loaded.property.name in SETTLED else None),
               "steps": [{"action": st.action, "rid": st.rid, "params": _params(st)}
                         for st in loaded.steps]}
    ranks = loaded.scenario.decode.ranks
    scans = [_scan_of(s, st) for s, st in zip(states, loaded.steps)]
    return Prepared(str(path), loaded, real, [project(s, ranks) for s in states], request, None,
                    scans)


def judge(prep: Prepared, answer: Optional[dict]) -> Result:
    """Compare the real replay with the model's, step by step."""
    steps = prep.loaded.steps
    name = prep.real.name
    if prep.request is None:
        return Result(name, prep.path, len(steps), 0, False,
                      {"step": 0, "action": None, "why": "not-driven",
                       "detail": f"the rig does not stand for {prep.why_not} yet"})
    observed: List[dict] = answer["observations"]
    for i, (m, x) in enumerate(zip(prep.model, observed)):
        # within a run of one scan's entries, the real call may have acted
        # on a later entry already: compared at the run's end
        end = _scan_end(prep, i)
        if m != x and not (end > i and end < len(observed)
                           and prep.model[end] == observed[end]):
            return Result(name, prep.path, len(steps), max(i - 1, 0), False,
                          {"step": i, "action": None if i == 0 else steps[i - 1].action,
                           "rid": None if i == 0 else steps[i - 1].rid,
                           "why": "state", "differs": _diff(m, x)})
    stop = answer.get("stop")
    if stop is not None:
        st = steps[stop["step"] - 1]
        return Result(name, prep.path, len(steps), stop["step"] - 1, False,
                      {"step": stop["step"], "action": st.action, "rid": st.rid,
                       "why": stop["why"], "detail": stop["detail"]})
    ok = violated(prep.loaded, steps, observed[-2], observed[-1], answer.get("final") or {})
    if ok is None:
        return Result(name, prep.path, len(steps), len(steps), False,
                      {"step": len(steps), "action": steps[-1].action, "rid": steps[-1].rid,
                       "why": "unread",
                       "detail": f"every step agrees; {prep.loaded.property.name} is not read "
                                 "on the real objects yet"})
    return Result(name, prep.path, len(steps), len(steps), ok,
                  None if ok else {"step": len(steps), "action": steps[-1].action,
                                   "rid": steps[-1].rid, "why": "no-violation",
                                   "detail": "every step agrees, but the real objects do not "
                                             "show the violation"})


def run(root: pathlib.Path, paths: List[str], release: Optional[Release] = None) -> List[Result]:
    """Replay each trace on the real code (its own release's, or ``release``'s):
    one worker per release, one fresh rig per trace."""
    preps = [prepare(p, release) for p in paths]
    by_release: Dict[str, List[int]] = {}
    for i, prep in enumerate(preps):
        if prep.request is not None:
            by_release.setdefault(prep.real.name, []).append(i)
    answers: Dict[int, dict] = {}
    for rel, idx in by_release.items():
        got = drive_traces(root, rel, [preps[i].request for i in idx])
        answers.update(zip(idx, got))
    return [judge(prep, answers.get(i)) for i, prep in enumerate(preps)]


def _params(st) -> Dict[str, Any]:
    from reqmodel.model.actions import BY_NAME
    return {k: (list(v) if isinstance(v, tuple) else v)
            for k, v in zip(BY_NAME[st.action].arg_names, st.arg)}


def _model_states(loaded):
    from reqmodel.engines.exhaustive import replay as model_replay
    got = model_replay(loaded.release, loaded.scenario, loaded.steps)
    return got


def _foreign_read(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    last = steps[-1]
    if last.action != "d_attend":
        return False
    pages = final["d"][last.rid]["pages"]
    return any(w not in (None, last.rid) for p in pages for w in _slices(final["writers"][p]))


def _slices(writer) -> list:
    """A decode page's writers, one per prefill rank's heads."""
    return writer if isinstance(writer, list) else [writer]


def _rejected_succeeded(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    for p, d in zip(final["p"], final["d"]):
        if (p["rejected"] and p["answer"] == "ok") or (d["rejected"] and d["answer"] == "ok"):
            return True
        if (p["rejected"] or d["rejected"]) and d["answer"] == "ok":
            return True
    return False


def _abort_overwritten(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    return any(x["to_finish"] == "abort" and x["finished"] not in (None, "abort")
               for x in final["p"] + final["d"])


def _crashed(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step's real call raised what kills the scheduler."""
    return any(x["crashed"] for x in final["p"] + final["d"])


def _room_left(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """A room every user of which is gone on both workers, with nothing of
    it on the wire, still has an entry in a KV manager."""
    n = len(final["p"])
    rooms = facts["rooms"]
    for room in set(rooms):
        users = [r for r in range(n) if rooms[r] == room]
        if any(final["p"][r]["stage"] != "gone" or final["d"][r]["stage"] != "gone"
               for r in users):
            continue
        if any(facts["room_on_wire"][r] for r in users):
            continue
        if any(facts["room_left"][r] for r in users):
            return True
    return False


def _write_into_reused(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step's write landed in a decode page another request owns."""
    writer = steps[-1].rid
    owner = {p: r for r, d in enumerate(final["d"]) for p in d["pages"]}
    return any(owner.get(p, writer) != writer for p in facts["landed"])


_POLL_ORDER = {"Failed": 0, "Bootstrapping": 1, "WaitingForInput": 2, "Transferring": 3,
               "Success": 4}
_ACQUIRING = {"p": ("bootstrap", "waiting", "forwarded", "inflight"),
              "d": ("prealloc", "transfer")}


def _side(action: str) -> str:
    return "d" if action.startswith("d_") else "p"


def _status_backwards(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """A prefill room's real status moved down the KVPoll order (not to
    Failed), or off Failed, in the last step."""
    for old, new in zip(_flat(prev["p_room"]), _flat(final["p_room"])):
        if old is None or new is None or old == new:
            continue
        if old == "Failed" or (_POLL_ORDER[new] < _POLL_ORDER[old] and new != "Failed"):
            return True
    return False


def _flat(rooms: list) -> list:
    """Per-rank entries (several prefill ranks) as one list."""
    return [x for room in rooms for x in (room if isinstance(room, list) else [room])]


def _aborted_preallocated(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step preallocated real pages for a request whose real Req
    carried an abort verdict."""
    last = steps[-1]
    if last.action != "d_prealloc":
        return False
    before = prev["d"][last.rid]
    return bool(final["d"][last.rid]["pages"]) and "abort" in (before["to_finish"],
                                                                before["finished"])


def _rejected_acquired(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step gave a request its worker's intake rejected a sender,
    receiver, metadata buffer, pages or a forward pass there."""
    last = steps[-1]
    side = _side(last.action)
    before, after = prev[side][last.rid], final[side][last.rid]
    if not after["rejected"]:
        return False
    moved = after["stage"] != before["stage"] and after["stage"] in _ACQUIRING[side]
    return moved or len(after.get("pages", [])) > len(before.get("pages", []))


def _abort_not_honoured(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """After the client's abort reached the worker's real ``abort_request``
    with the request unfinished there, the last step answered it 200, or ran
    a forward pass for it while its Req carries no abort verdict."""
    last = steps[-1]
    side = _side(last.action)
    r = last.rid
    if r not in facts["abort_reached"][side] or last.action in ("p_abort", "d_abort"):
        return False
    before, after = prev[side][r], final[side][r]
    if before["answer"] is None and after["answer"] == "ok":
        return True
    forward = last.action in ("p_forward", "d_attend")
    return forward and "abort" not in (before["to_finish"], before["finished"])


def _wrong_cause(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step gave a worker's first answer for a request (a scan
    answers several), and the cause its real finish reason tells
    (``tracerig._cause``) is not one that worker was given (``causes_told``,
    as the property asks it of the model's states)."""
    for side in ("p", "d"):
        for r, (before, after) in enumerate(zip(prev[side], final[side])):
            if before["answer"] is not None or after["answer"] is None:
                continue
            told = causes_told(after["rejected"], r in facts["abort_reached"][side])
            if facts["cause"][side][r] not in told:
                return True
    return False


def _session_left(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """A request gone from a worker whose streaming session still has its
    in-flight mark there (the real ``Session._inflight``)."""
    return any(v["stage"] == "gone" and v["session"] for side in ("p", "d") for v in final[side])


def _foreign_commit(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step committed the request on metadata of another room, or
    with reserved pages its transfer did not write (read on the real slot
    and pages just before ``pop_transferred``)."""
    got = facts.get("commit")
    last = steps[-1]
    if last.action != "d_transferred" or not got or got["rid"] != last.rid:
        return False
    return got["committed"] and not (got["room_ok"] and got["covered"])


def _commit_before_all_ranks(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step committed the request while fewer prefill ranks than
    there are had reported Success for its own transfer (read on decode's
    response tracker just before ``pop_transferred``)."""
    got = facts.get("commit")
    last = steps[-1]
    if last.action != "d_transferred" or not got or got["rid"] != last.rid:
        return False
    return got["committed"] and got["own_reports"] < got["ranks"]


def _ranks_split(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The last step left the request at different stages on decode's ranks
    (one rank's pop_preallocated took it, a peer's kept it queued), and the
    ranks' next transfer scans do not meet at their poll all-reduce."""
    ranks = final.get("d_ranks")
    split = bool(ranks) and len(set(ranks[steps[-1].rid])) > 1
    return split and facts.get("next_transfer_scan", "met") != "met"


def _drain_ack_missing(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """Decode holds a request for a drain ack that the prefill rank, done
    with its ABORT and drained, will never send (read on both managers and
    the wire)."""
    return any(facts["held_without_ack"])


def _hang(pending):
    def read(steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
        got = facts.get("settled")
        if not got or got["crash"] or not got.get("quiet"):
            return False  # a crash answers everyone (with an error); still moving
        obs = got["observation"]
        return any(pending(obs, r, facts) for r in range(len(obs["p"])))
    return read


def _waits(obs: dict, r: int, facts: dict) -> bool:
    """The client waits for request r: it reached a worker, both workers
    have not answered it, and its abort reached neither."""
    p, d = obs["p"][r], obs["d"][r]
    arrived = p["stage"] != "absent" or d["stage"] != "absent"
    aborted = r in facts["abort_reached"]["p"] or r in facts["abort_reached"]["d"]
    return arrived and not aborted and (p["answer"] is None or d["answer"] is None)


def _held_after_abort(obs: dict, r: int, facts: dict) -> bool:
    """Request r's abort reached a worker and a worker has not ended it."""
    aborted = r in facts["abort_reached"]["p"] or r in facts["abort_reached"]["d"]
    return aborted and not (obs["p"][r]["stage"] == "gone" and obs["d"][r]["stage"] == "gone")


# liveness properties: read by letting both workers run their own steps on
# the real objects until nothing changes (``Rig.settle``)
SETTLED = {"answered-without-timeout": _waits,
           "abort-released-without-timeout": _held_after_abort,
           # ... and with every KV timeout made due in each round (a wait
           # that nothing ends: a client still waits after it)
           "every-wait-bounded": _waits}
TIMED = ("every-wait-bounded",)


# property -> how its violation is read on the rig's observation after the
# last step; a property not here is not read on the real objects (yet)
READERS = {"no-foreign-kv-read": _foreign_read,
           "rejected-never-succeeds": _rejected_succeeded,
           "pending-abort-not-overwritten": _abort_overwritten,
           "no-scheduler-crash": _crashed, "no-poll-of-popped-room": _crashed,
           "room-state-released": _room_left,
           "no-reuse-during-inflight-write": _write_into_reused,
           "transfer-status-monotone": _status_backwards,
           "aborted-not-preallocated": _aborted_preallocated,
           "reject-acquires-nothing": _rejected_acquired,
           "client-abort-honoured": _abort_not_honoured,
           "answer-matches-cause": _wrong_cause,
           "session-mark-released": _session_left,
           "metadata-integrity": _foreign_commit,
           "commit-after-all-ranks": _commit_before_all_ranks,
           "ranks-stay-in-step": _ranks_split,
           "drain-ack-reaches-every-rank": _drain_ack_missing,
           **{name: _hang(pending) for name, pending in SETTLED.items()}}


def violated(loaded, steps, prev: dict, final: dict, facts: dict) -> Optional[bool]:
    """The property's violation, read from the real objects; None when the
    rig has no reader for the property."""
    read = READERS.get(loaded.property.name)
    facts = dict(facts, rooms=loaded_initial_rooms(loaded))
    return None if read is None else read(steps, prev, final, facts)


def loaded_initial_rooms(loaded) -> List[int]:
    s0 = loaded_initial(loaded)
    return [s0.room_slot(r) for r in range(loaded.scenario.n)]
