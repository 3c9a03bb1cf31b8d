"""The property catalog: safety (``always``) and reachability (``sometimes``).

Properties sit apart from the actions, as invariants do in a TLA+ spec.  A
safety property is either a *state* predicate (must hold in every reachable
state) or a *transition* predicate over ``(pre, step, events, post)`` (must
hold on every reachable transition).  A reachability property names a good
state that some path must reach: it guards against vacuous success (a model
or guard that blocks everything makes every safety property hold, and fails
these).

Names are the stable kebab-case names of the modelling reference (§8); they
are the public API of ``reqmodel check --property``.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

from reqmodel.model import guards as g
from reqmodel.model import events as ev
from reqmodel.model.actions import Ctx, enabled, timeout_armed
# what a property is; re-exported here, where the engines have always read it
from reqmodel.model.property import WAITS, Every, Kind, Property, every  # noqa: F401
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.leftover import nothing_left_behind, room_state_released, session_turns_ended
from reqmodel.model.state import causes_told, DStage, KVPoll, PStage, State


CATALOG: Dict[str, Property] = {}


def prop(**kw) -> Property:
    p = Property(**kw)
    CATALOG[p.name] = p
    return p


def _has_door(rel: Release, sc: Scenario) -> bool:
    return not (rel.prefill_door is g.prefill_door_admit_all
                and rel.decode_door is g.decode_door_admit_all)


# ------------------------------------------------------------------ safety

prop(
    name="no-foreign-kv-read", kind="always", ref="I1",
    gate="transfer-read", on_violation="fail",
    text="Decode never attends over a page of its handoff range that another request wrote last.",
    transition=every(ev.Read, lambda e, pre, post: not e.foreign),
)


def _rejected_never_succeeds(s: State) -> bool:
    for p, d in zip(s.p, s.d):
        if p.rejected and p.answer == 200:  # the rejecting worker reports success
            return False
        if d.rejected and d.answer == 200:
            return False
        if (p.rejected or d.rejected) and d.answer == 200:  # the client gets a 200
            return False
    return True


prop(
    name="rejected-never-succeeds", kind="always", ref="I2",
    gate="admission", on_violation="fail",
    text="A request rejected at a worker's intake never gets FINISH_LENGTH / 200 from that worker, and the client (served by decode) never gets a 200 for it.",
    state=_rejected_never_succeeds,
)


def _pending_abort_kept(s: State) -> bool:
    for req in s.p + s.d:
        if (req.to_finish is not None and req.to_finish.is_abort
                and req.finished_reason is not None and not req.finished_reason.is_abort):
            return False
    return True


prop(
    name="pending-abort-not-overwritten", kind="always", ref="I3",
    gate="admission", on_violation="fail",
    text="A pending FINISH_ABORT in to_finish is never overwritten by a non-abort finished_reason (#33507).",
    state=_pending_abort_kept,
)

prop(
    name="no-late-result-side-effects", kind="always", ref="I4",
    gate="lifetime", on_violation="fail",
    text="A prefill result that arrives after its request was retired sends, queues, caches and releases nothing.",
    transition=every(ev.LateEffect, lambda e, pre, post: False),
)

prop(
    name="abort-is-terminal", kind="always", ref="I5",
    gate="admission", on_violation="fail",
    text="An aborted request is never requeued for more prefill work.",
    transition=every(ev.Requeue, lambda e, pre, post: not g.is_aborted(pre.p[e.rid])),
)


def _acquirer_not_rejected(e, pre, post) -> bool:
    side = pre.p[e.rid] if isinstance(e, ev.Acquire) and e.side == "prefill" else pre.d[e.rid]
    return not side.rejected


prop(
    name="reject-acquires-nothing", kind="always", ref="I6",
    gate="admission", on_violation="fail",
    text="A request rejected at a worker's intake acquires no sender, receiver, metadata buffer, KV or forward pass there.",
    transition=every((ev.Acquire, ev.Prealloc), _acquirer_not_rejected),
)




prop(
    name="release-exactly-once", kind="always", ref="I11",
    gate="lifetime", on_violation="fail",
    text="KV, Mamba, metadata buffers, cache ownership and decode's host backup of a retracted request are released exactly once: never on a non-holder, never left behind by a finished request.",
    state=nothing_left_behind, transition=every(ev.Release, lambda e, pre, post: e.held),
)


def _cleanup_ran(e, pre, post) -> bool:
    req = post.p[e.rid] if e.side == "prefill" else post.d[e.rid]
    return not (req.session_slot or req.cache_handle or req.to_finish is not None
                or req.finished_reason is None or req.answer is None)


prop(
    name="early-retire-runs-cleanup", kind="always", ref="I12",
    gate="admission", on_violation="fail",
    text="A door retire releases the conversation slot and cache handle, promotes the verdict and answers the client.",
    transition=every(ev.DoorRetire, _cleanup_ran), applies=_has_door,
)

prop(
    name="reentry-not-retired", kind="always", ref="I13",
    gate="admission", on_violation="fail",
    text="A re-entering request (retracted, or owning KV, metadata or a host backup) is never retired at a door.",
    transition=every(ev.DoorRetire, lambda e, pre, post: not e.reentering),
    applies=_has_door,
)

prop(
    name="aborted-not-preallocated", kind="always", ref="I16",
    gate="admission", on_violation="warn",
    text="Decode never preallocates pages for a request that is already aborted.",
    transition=every(ev.Prealloc, lambda e, pre, post: not e.aborted),
)


def _abort_reached(s: State, side: str, r: int) -> bool:
    return s.p[r].abort_reached if side == "prefill" else s.d[r].client_aborted


def _abort_honoured(e, pre, post) -> bool:
    if not _abort_reached(pre, e.side, e.rid):
        return True
    if isinstance(e, ev.Stream):
        return e.status != 200
    if isinstance(e, ev.Acquire) and e.resource != "forward":
        return True
    # a forward pass (prefill's chunk, decode's attention over the pages) is
    # the one method 3 allows while the Req carries the abort's verdict
    req = pre.p[e.rid] if e.side == "prefill" else pre.d[e.rid]
    verdict = req.to_finish or req.finished_reason
    return verdict is not None and verdict.is_abort


prop(
    name="client-abort-honoured", kind="always", ref="#23",
    gate="admission", on_violation="warn",
    text="Once the client's abort has reached a worker's scheduler while that worker holds the "
         "request unfinished, the worker runs no further forward pass for it and does not "
         "answer it 200. A forward pass while the request carries the abort's verdict "
         "(method 3's to_finish: 'the request will still run one forward pass') is allowed; "
         "a request that finished before its abort was read is a benign race (the abort "
         "then finds nothing to reach).",
    transition=every((ev.Stream, ev.Acquire, ev.Read), _abort_honoured),
    applies=lambda rel, sc: _aborts(sc),
)


def _causes(s: State, side: str, r: int) -> Tuple[str, ...]:
    """What that worker's scheduler had seen (``causes_told``); a failure or
    a completion's pages are ``no-foreign-kv-read``'s."""
    req = s.p[r] if side == "prefill" else s.d[r]
    return causes_told(req.rejected, _abort_reached(s, side, r))


def _answer_matches_cause(e, pre, post) -> bool:
    """Only a worker's first answer reaches the client (the tokenizer manager
    forgets the request at it); what the worker was given is read after the
    step, which may itself be the abort that answers (method 1)."""
    req = pre.p[e.rid] if e.side == "prefill" else pre.d[e.rid]
    return req.answer is not None or e.cause in _causes(post, e.side, e.rid)


prop(
    name="answer-matches-cause", kind="always", ref="A1",
    gate="lifetime", on_violation="warn",
    text="Each worker's first answer names the cause its scheduler was given: a request "
         "rejected at that worker's intake is answered with the rejection (400 and its "
         "message), a request whose client's abort reached that worker with the abort's own "
         "verdict (not a transfer or bootstrap failure's 500, which the HTTP layer reports as a "
         "server error, and not a success), and no other request with a rejection or an abort "
         "it was not given.",
    transition=every(ev.Stream, _answer_matches_cause),
)

# ------------------------------------------- lifetime and ownership (#3)


def _no_write_into_reused_page(e, pre, post) -> bool:
    return all(pre.d_pages[pg].owner in (None, e.rid) for pg in e.pages)


prop(
    name="no-reuse-during-inflight-write", kind="always", ref="#3",
    gate="lifetime", on_violation="fail",
    text="A KV chunk in flight never lands in a decode page that has since been handed to another request.",
    transition=every(ev.Write, _no_write_into_reused_page),
)


def _status_monotone(pre, step, evs, post) -> bool:
    for a, b in zip(pre.rooms, post.rooms):
        old, new = a.status, b.status
        if old is None or new is None or old == new:
            continue  # created, cleared, unchanged
        if old == KVPoll.Failed or (new < old and new != KVPoll.Failed):
            return False
    return True


prop(
    name="transfer-status-monotone", kind="always", ref="#3",
    gate="transfer-read", on_violation="warn",
    text="A room's transfer status only moves up the KVPoll order or to Failed, and Failed is never replaced (until the entry is cleared).",
    transition=_status_monotone,
)


def _commits_own_metadata(e, pre, post) -> bool:
    req = pre.d[e.rid]
    slot = pre.d_slots[req.meta_slot]
    return slot.room == e.room and slot.covered_pages >= req.reserved_pages


prop(
    name="metadata-integrity", kind="always", ref="#3",
    gate="transfer-read", on_violation="warn",
    text="Decode commits a transfer only on metadata its own room wrote, covering every page it reserved.",
    transition=every(ev.Commit, _commits_own_metadata),
)


def _corruption_was_real(e: ev.CorruptionAbort, pre: State, post: State) -> bool:
    """The request decode aborts as corrupted did receive something its own
    transfer did not write: a page of its range another request (or nobody)
    wrote last, or metadata from another transfer (the slot's room, or the
    digest it kept at commit, is another request's)."""
    d = pre.d[e.rid]
    own_pages = all(pre.d_pages[p].written_by(e.rid) for p in d.pages)
    if e.check == "room":
        own_meta = pre.d_slots[d.meta_slot].room == pre.room_slot(e.rid) + 1
    else:
        own_meta = d.expected_checksum is not None and d.expected_checksum[0] == e.rid
    return not (own_pages and own_meta)


prop(
    name="no-false-corruption-abort", kind="always", ref="#23",
    gate="transfer-read", on_violation="fail",
    text="Decode aborts a request as corrupted (room check or KV checksum) only when its pages or "
         "its metadata hold something its own transfer did not write: a good transfer is never "
         "failed as corrupted.",
    transition=every(ev.CorruptionAbort, _corruption_was_real),
)


prop(
    name="commit-after-all-ranks", kind="always", ref="#3",
    gate="transfer-read", on_violation="warn",
    text="Decode commits a transfer only once every prefill rank has reported Success for that "
         "request's own transfer (a Success left over from an earlier request of the same "
         "bootstrap_room does not count).",
    transition=every(ev.Commit, lambda e, pre, post: e.own_reports() >= e.ranks),
)


prop(
    name="no-poll-of-popped-room", kind="always", ref="#3",
    gate="lifetime", on_violation="fail",
    text="Decode never polls a receiver whose request_status entry another request of the "
         "same bootstrap_room has popped (check_status raises KeyError in the scheduler loop). "
         "One case of no-scheduler-crash: the decode side's check_status crash.",
    transition=every(ev.Crash, lambda e, pre, post: not (e.side == "decode"
                                                          and e.call == "check_status")),
)

prop(
    name="no-scheduler-crash", kind="always", ref="C1",
    gate="lifetime", on_violation="fail",
    text="No exception escapes a scheduler loop: no poll of a room whose request_status entry "
         "another request popped (check_status KeyError, on decode and, up to 0.5.22, on "
         "prefill), no release_kv_cache on a request holding no KV without a Mamba-capable "
         "tree cache (AssertionError). Covers no-poll-of-popped-room.",
    transition=every(ev.Crash, lambda e, pre, post: False),
)


prop(
    name="ranks-stay-in-step", kind="always", ref="#51",
    gate="lifetime", on_violation="fail",
    text="Decode's ranks of one attention-TP group take the same scheduling decisions: no "
         "request is preallocated or resumed on some ranks and left queued on others because "
         "one rank's own pool still holds pages or a metadata slot its peers freed. Ranks that "
         "disagree enter their next collectives with different queues: one waits in a poll "
         "all-reduce while a peer with an empty queue has gone on to another collective (a hang "
         "until the CPU group's timeout, then the scheduler dies), or their poll lengths differ "
         "and gloo aborts the process.",
    state=lambda s: not s.diverged(),
)


prop(
    name="ack-belongs-to-its-hold", kind="always", ref="#3",
    gate="lifetime", on_violation="warn",
    text="A held decode request lets its pages go on drain acks only when each ack answers its "
         "own ABORT, not that of another request that used the same bootstrap_room.",
    transition=every(ev.AckRelease, lambda e, pre, post: e.origins == (e.rid,)),
)


def _drain_acks_reach_holders(s: State) -> bool:
    for r, d in enumerate(s.d):
        if d.stage is not DStage.HELD:
            continue
        slot = s.room_slot(r)
        for q, room in enumerate(s.rooms_of_slot(slot)):
            if room.poisoned or room.outstanding > 0:
                continue  # prefill rank q cannot (yet) vouch for the drain
            for k in d.held:
                if q in s.d_rooms[slot].acked_by(k):
                    continue
                pending = any(m.rank == k and m.prank == q and (
                    (m.kind == "abort" and m.rid == r)
                    or (m.kind == "ack" and s.room_slot(m.rid) == slot)) for m in s.net)
                if not pending:  # q has handled k's ABORT, drained, and no ack is coming
                    return False
    return True


prop(
    name="drain-ack-reaches-every-rank", kind="always", ref="#3",
    gate="lifetime", on_violation="warn",
    text="Once a prefill rank has handled a decode rank's ABORT and its room has drained, that "
         "decode rank holding the pages gets a drain ack from it that it counts (it is not left "
         "to its 30 s timeout).",
    state=_drain_acks_reach_holders,
)



prop(
    name="room-state-released", kind="always", ref="#3",
    gate="lifetime", on_violation="warn",
    text="Once a request is gone from both workers and nothing of its room is in flight, no "
         "control-plane entry for its room remains (request_status, transfer_infos, "
         "failure_records, ack targets, poison mark, outstanding count, decode's drain-ack tracker "
         "and request_status).",
    state=room_state_released,
)




prop(
    name="session-mark-released", kind="always", ref="A3",
    gate="lifetime", on_violation="warn",
    text="A request gone from a worker has ended its streaming session's turn there: the "
         "in-flight mark is cleared, so the session takes its next turn and can close.",
    state=session_turns_ended, applies=lambda rel, sc: sc.sessions and rel.pd_session_requests,
)

# --------------------------------------------------------------- liveness


def _aborts(sc: Scenario) -> bool:
    """An abort can reach a worker: the client's, or the scheduler's own
    waiting timeout (the same ``abort_request``)."""
    return sc.events.any("client_abort") or sc.events.any("req_waiting_timeout")


def _aborted(s: State, r: int) -> bool:
    """The client's abort of request r reached a worker."""
    return s.aborted_by_client[r] or s.d[r].client_aborted


def answered(s: State, r: int) -> bool:
    """Both workers have sent request r's final answer (the router waits for
    both responses: the client is answered when both are), or the client has
    given up on it (its abort reached a worker): nobody waits for it then.
    A dead prefill instance answers its leg by the connection error its
    client gets (``p_dies``)."""
    return (((s.p[r].answer is not None or s.prefill_down(r)) and s.d[r].answer is not None)
            or _aborted(s, r))


def settled(s: State, r: int) -> bool:
    """Request r is ``answered``, or the model stops (``State.halted``): a
    crashed server answers nobody, but its clients get a connection error,
    not a wait for a timeout, and ``no-scheduler-crash`` reports the crash;
    ranks that diverged are past what the model follows, and
    ``ranks-stay-in-step`` reports them."""
    return answered(s, r) or s.halted()


def waiting(s: State, r: int) -> bool:
    """Request r's client waits: the request reached a worker and has not
    been answered (a request not sent yet keeps nobody waiting)."""
    arrived = s.p[r].stage is not PStage.ABSENT or s.d[r].stage is not DStage.ABSENT
    return arrived and not settled(s, r)


def stuck(ctx: Ctx, s: State, pending: Callable[[State, int], bool]) -> bool:
    """Some request is ``pending`` and no step of the deployment's own is
    enabled: only a timeout (or the environment) can move it (the deadlock
    form of an always-possibly property)."""
    if not any(pending(s, r) for r in range(len(s.p))):
        return False
    return not any(a.own(ctx, s, r) for a, r in enabled(ctx, s))


def deadlocked(ctx: Ctx, s: State) -> bool:
    """Some request's client waits and only a timeout can move it."""
    return stuck(ctx, s, waiting)


prop(
    name="answered-without-timeout", kind="always-possibly", ref="L1",
    gate="lifetime", on_violation="warn",
    text="From every state reached without a timeout, every request whose client waits can "
         "still be answered by both workers through the deployment's own steps: no timeout "
         "(bootstrap, waiting, deferred release) and no client abort, transfer failure, "
         "retraction or pause is needed.",
    goal=settled, pending=waiting, partial=lambda ctx, s: not deadlocked(ctx, s),
    partial_note="checked only in its deadlock form (a request unanswered with nothing but a "
                 "timeout or the environment able to move); the AG EF form needs the whole "
                 "state graph",
)


def ended(s: State, r: int) -> bool:
    """Both workers are done with request r: its ``Req`` finished there and
    what it held (pages, metadata slot, sender or receiver) was freed (a
    dead prefill instance holds nothing any more)."""
    return ((s.p[r].stage is PStage.GONE or s.prefill_down(r))
            and s.d[r].stage is DStage.GONE)


def ended_or_down(s: State, r: int) -> bool:
    """Request r has ``ended`` on both workers, or the model stops (as in
    ``settled``)."""
    return ended(s, r) or s.halted()


def held_after_abort(s: State, r: int) -> bool:
    """Request r's client has aborted (the abort reached a worker), and a
    worker has not ended it yet."""
    return _aborted(s, r) and not ended_or_down(s, r)


prop(
    name="abort-released-without-timeout", kind="always-possibly", ref="#23",
    gate="lifetime", on_violation="warn",
    text="From every state reached without a timeout, a request whose abort (the client's, or "
         "a scheduler's own SGLANG_REQ_WAITING_TIMEOUT) has reached a worker can still be ended "
         "on both workers (finished, its pages and slots freed) through the deployment's own "
         "steps: no worker holds it until a timeout.",
    goal=ended_or_down, pending=held_after_abort,
    applies=lambda rel, sc: _aborts(sc),
    partial=lambda ctx, s: not stuck(ctx, s, held_after_abort),
    partial_note="checked only in its deadlock form (an aborted request held with nothing but "
                 "a timeout or the environment able to move); the AG EF form needs the whole "
                 "state graph",
    stuck="is still held by a worker after its abort",
)

prop(
    name="no-livelock", kind="eventually", ref="L2",
    gate="lifetime", on_violation="warn",
    text="No cycle of the deployment's own steps that a weakly fair scheduler can run forever "
         "(every step that stays enabled is eventually taken) while a request's client waits.",
    goal=settled, pending=waiting,
    partial_note="a lasso needs the whole state graph",
)


def _unbounded(ctx: Ctx, s: State) -> bool:
    """Some request's client waits, nothing the deployment does on its own
    can move, and no timeout is armed (whether the scenario lets it fire or
    not): the deadlock form of ``every-wait-bounded``."""
    return deadlocked(ctx, s) and not timeout_armed(ctx, s)


prop(
    name="every-wait-bounded", kind="bounded", ref="L3",
    gate="lifetime", on_violation="fail",
    text="From every reachable state (after timeouts, faults and client aborts too), every "
         "request whose client waits can still be answered through the deployment's own steps "
         "or a timeout: no request waits where no step and no armed timeout can end the wait.",
    goal=settled, pending=waiting, partial=lambda ctx, s: not _unbounded(ctx, s),
    partial_note="checked only in its deadlock form (a request unanswered with nothing able to "
                 "move and no timeout armed); the AG EF form needs the whole state graph",
    stuck="has a client that waits for good",
)

# ------------------------------------------------------------ reachability


def _valid_completes(s: State) -> bool:
    return any(not p.rejected and not d.rejected and p.answer == 200 and d.answer == 200
               and d.own_data for p, d in zip(s.p, s.d))


def _has_valid_request(rel: Release, sc: Scenario) -> bool:
    """Some request fits both workers' intake (or is truncated rather than rejected)."""
    return any(not sc.prefill.rejects(n) and not sc.decode.rejects(n) for n in sc.prompt_pages)


prop(
    name="valid-request-completes", kind="sometimes", ref="R1",
    gate="admission", on_violation="fail",
    text="Some path serves a valid request with a 200 built only from its own pages.",
    state=_valid_completes, applies=_has_valid_request,
)

prop(
    name="reentry-can-resume", kind="sometimes", ref="R2",
    gate="admission", on_violation="fail",
    text="Some path retracts (or pause-retracts) a request on decode, brings it back and serves it a 200 from its own pages.",
    state=lambda s: any(d.was_retracted and d.answer == 200 and d.own_data for d in s.d),
    applies=lambda rel, sc: sc.events.any("retract") or sc.events.any("preempt"),
)

prop(
    name="drain-ack-releases-hold", kind="sometimes", ref="R3",
    gate="lifetime", on_violation="warn",
    text="Some path holds an aborted request's decode pages and releases them on the drain "
         "acks of every rank that notified prefill.",
    state=lambda s: any(d.released_on_ack for d in s.d),
    applies=lambda rel, sc: Ctx(rel, sc).deferred
    and (sc.events.any("client_abort") or sc.events.any("timeouts")),
)

SAFETY = tuple(p for p in CATALOG.values() if p.kind is Kind.ALWAYS)
LIVENESS = tuple(p for p in CATALOG.values() if p.kind.on_graph)
REACHABILITY = tuple(p for p in CATALOG.values() if p.kind is Kind.SOMETIMES)


class PropertyError(ValueError):
    pass


def select(names) -> Tuple[Property, ...]:
    if not names:
        return tuple(CATALOG.values())
    out = []
    # --property a,b is --property a --property b
    for n in [part for name in names for part in str(name).split(",")]:
        if n not in CATALOG:
            from reqmodel.messages import did_you_mean, short
            raise PropertyError(f"unknown property {short(n)}{did_you_mean(n, CATALOG)} "
                                "('reqmodel properties' lists them)")
        out.append(CATALOG[n])
    return tuple(out)
