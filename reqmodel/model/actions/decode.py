"""The decode worker's scheduler: the door (``DecodePreallocQueue.add``),
preallocation, the transfer queue's polls and commit, attention, the answer,
retraction and pause (the release of a request's pages, and the deferred
release of failed requests' pages, are ``drelease``).

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from reqmodel.model.events import (Acquire, Commit, CorruptionAbort, Crash, DoorRetire,
                                   Prealloc, RankRelease, Read, Release, StatusDropped,
                                   poll_key_error)
from reqmodel.model.actions.core import action, Ctx, Effect, Needs, PRANK_ARG, set_d
from reqmodel.model.actions.dpool import page_choices, retracted_reserve, slot_choices
from reqmodel.model.actions.drelease import clear_checksum, d_release, resolve_held
from reqmodel.model.actions.kvmanager import (all_ranks, apply_report, d_room_of, layout_tag,
                                              latch_transfer_queue, transfer_poll_raises,
                                              notify_abort, receiver_clear, receiver_init,
                                              receiver_poll, room_id)
from reqmodel.model.actions.req import (failure_reason, run_retire_cleanup, session_turn_aborted,
                                        stream_d, validate_intake)
from reqmodel.model.actions.transport import (arriving, channels, consume, prank_args, prank_of,
                                              send)
from reqmodel.model.guards import is_aborted
from reqmodel.model.state import (ABORT_400, ABORT_500, DecodeReq, DStage, KVPoll, LENGTH,
                                  MetaSlot, Msg, MsgKind, PrefillReq, PStage, replace, State)


def _at_d_door(c, s, r):
    return s.d[r].stage is DStage.DOOR


@action("decode", guard=_at_d_door, needs=Needs(d={DStage.DOOR}), seam="decode_door")
def d_door(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D1 ``DecodePreallocQueue.add`` (dc 617/640/734/784/808): the release's
    ``decode_door`` guard point with the caller's ``is_retracted`` flag, then
    ``_check_if_req_exceed_kv_capacity`` on D's pool, then the retracted queue
    or a new receiver whose ``init()`` reaches WaitingForInput whatever P
    decided (cc 19:1366-1418)."""
    req = s.d[r]
    rel = c.release
    is_retracted = req.door_flag == "retracted"
    is_rebootstrap = req.door_flag == "rebootstrap"
    if rel.decode_door(req, is_retracted, is_rebootstrap):
        reentering = (is_retracted or is_rebootstrap or req.is_retracted or req.holds_kv
                      or req.retraction_backup)
        s = set_d(s, r, stage=DStage.GONE, door_flag=None,
                  **run_retire_cleanup(c, req, rel.retire_cleanup))
        evs = (DoorRetire(r, "decode", reentering),)
        if "stream" in rel.retire_cleanup:
            s, ev2 = stream_d(s, r, s.d[r].finished_reason or ABORT_400)
            evs += ev2
        return s, evs
    if req.origin_pages > c.scenario.decode.pool_pages:
        s = set_d(s, r, stage=DStage.GONE, finished_reason=ABORT_400, door_flag=None,
                  **session_turn_aborted(c))
        return stream_d(s, r, ABORT_400)
    if is_retracted:
        return set_d(s, r, stage=DStage.RETRACTED, door_flag=None), ()
    s, polled = receiver_init(c, s, r)
    # Bootstrapping: pending, its instance's registration dropped
    latched = polled if polled in (KVPoll.Failed, KVPoll.Success, KVPoll.Bootstrapping) else (
        KVPoll.WaitingForInput)
    s = set_d(s, r, stage=DStage.PREALLOC, has_receiver=True,
              receiver_state=latched, notified=(), held=(), waiting_for_input=False)
    return s, (Acquire(r, "decode", "receiver"),)


def _scanned(c: Ctx, s: State, r: int) -> bool:
    """The abort scan drops the entry: the ``prealloc_scan`` guard point, or
    a Failed poll that the handshake turned into ``prepare_abort`` (only when
    the handshake polls: 0.5.19 skips it while every entry waits)."""
    return c.release.prealloc_scan(s.d[r]) or (
        _handshake_polls(c, s) and receiver_poll(c, s, r) == KVPoll.Failed)


def _prealloc_drop(c, s, r):
    return (s.d[r].stage is DStage.PREALLOC and _scanned(c, s, r)
            and handshake_raises(c, s) is None)


def _dropped(c: Ctx, s: State) -> List[int]:
    """The entries one ``pop_preallocated`` call drops: its handshake polls
    the whole queue once, then its first loop drops every entry it finds
    finished (dc 21:1288-1300), in the same call."""
    return [u for u in range(len(s.d)) if _prealloc_drop(c, s, u)]


def drop_scanned(c: Ctx, s: State, drops: List[int]) -> Effect:
    """Stream each dropped entry's abort and clear its receiver."""
    s, evs = handshake(c, s), ()
    for u in drops:
        req = s.d[u]
        reason = (req.finished_reason if (req.finished_reason and req.finished_reason.is_abort)
                  else ABORT_500)
        s = set_d(receiver_clear(c, s, u), u, stage=DStage.GONE, finished_reason=reason,
                  has_receiver=False, cache_handle=False, **session_turn_aborted(c))
        s, ev = stream_d(s, u, reason)
        evs += ev
    return s, evs


def _first_dropped(c, s, r):
    # r, the first entry the call drops, names the call
    return _prealloc_drop(c, s, r) and not any(_prealloc_drop(c, s, u) for u in range(r))


@action("decode", guard=_first_dropped, needs=Needs(d={DStage.PREALLOC}))
def d_prealloc_drop(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D2 ``pop_preallocated`` first loop (dc 1141/1157/1293/1365/1395): every
    entry the ``prealloc_scan`` guard point drops, or whose receiver polled
    Failed (``prepare_abort``), is streamed and its receiver cleared, in one
    call (r, the first of them, names it).  The scan runs after the
    handshake (dc 19:1094, 23:1347): when that raises, nothing is dropped
    (``handshake_raises``), nor while a request waits retracted (the decode
    loop's return, ``processes.DECODE_LOOP``)."""
    return drop_scanned(c, s, _dropped(c, s))


def _prealloc_need(c: Ctx, req: DecodeReq, prefix: int) -> int:
    return req.origin_pages - prefix


def _prealloc_choices(c, s, r):
    req = s.d[r]
    prefixes = (0, 1) if _radix_hit_possible(c, req) else (0,)
    slots = slot_choices(s)
    for prefix in prefixes:
        for pages in page_choices(s, _prealloc_need(c, req, prefix)):
            if len(slots) == 1:  # the usual case: the slot is no choice
                yield (prefix, pages)
            else:
                for slot in slots:
                    yield (prefix, pages, slot)


def _handshake_polls(c: Ctx, s: State) -> bool:
    """``_update_handshake_waiters`` polls the whole prealloc queue at every
    ``pop_preallocated`` from 0.5.20 (dc 20:887-905); 0.5.19 skips the poll
    while every entry is ``waiting_for_input`` and none concluded Failed (dc
    19:871-879).  An entry is waiting once a handshake poll read
    WaitingForInput for it (``DecodeReq.waiting_for_input``): the door only
    queues a new ``DecodeRequest`` (``add``, dc 19:709), so the first
    ``pop_preallocated`` after it always polls.  (The model took that first
    poll with the door until replaying the prefill-TP traces on 0.5.19's
    code showed the crash one scan earlier.)"""
    return c.release.handshake_polls_waiting or any(
        d.stage is DStage.PREALLOC and d.has_receiver
        and (d.receiver_state is not KVPoll.WaitingForInput or not d.waiting_for_input)
        for d in s.d)


def unmarked(c: Ctx, s: State, u: int) -> bool:
    """Entry u is in the prealloc queue, not yet ``waiting_for_input``, and
    its poll reads WaitingForInput: the handshake would mark it."""
    d = s.d[u]
    return (d.stage is DStage.PREALLOC and d.has_receiver and not d.waiting_for_input
            and receiver_poll(c, s, u) == KVPoll.WaitingForInput)


def handshake(c: Ctx, s: State) -> State:
    """The flags the handshake's poll leaves: every entry whose poll read
    WaitingForInput is ``waiting_for_input`` (dc 19:899-901).  Only where a
    handshake may skip its poll (0.5.19); elsewhere nothing reads them."""
    if c.release.handshake_polls_waiting or not _handshake_polls(c, s):
        return s
    for u in [u for u in range(len(s.d)) if unmarked(c, s, u)]:
        s = set_d(s, u, waiting_for_input=True)
    return s


def _handshake_sees_success(c, s, r):
    req = s.d[r]
    return (req.stage is DStage.PREALLOC and req.has_receiver
            and receiver_poll(c, s, r) in (KVPoll.Transferring, KVPoll.Success)
            and handshake_raises(c, s) == "ValueError")


def handshake_raises(c: Ctx, s: State) -> Optional[str]:
    """What ``_update_handshake_waiters`` raises on decode's prealloc queue in
    ``s``, if it polls: ``poll_and_all_reduce`` polls every receiver first,
    so a popped room's KeyError (``d_poll_popped_room``) comes before the
    loop's ValueError (``d_unexpected_poll``)."""
    if not _handshake_polls(c, s):
        return None
    polls = [receiver_poll(c, s, r) for r, d in enumerate(s.d)
             if d.stage is DStage.PREALLOC and d.has_receiver]
    if any(p is None for p in polls):
        return "KeyError"
    if any(p in (KVPoll.Transferring, KVPoll.Success) for p in polls):
        return "ValueError"
    return None


@action("decode", guard=_handshake_sees_success, needs=Needs(d={DStage.PREALLOC}), crash=True)
def d_unexpected_poll(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``_update_handshake_waiters`` has branches for Bootstrapping,
    WaitingForInput and Failed only and raises ``ValueError("Unexpected poll
    case")`` on anything else (dc 19:926, 20:942, 21:1077, 22:1149,
    23:1179); ``pop_preallocated`` calls it first (dc 19:1094, 21:1245) and
    nothing catches it: the decode scheduler dies.  A handshaking receiver
    reads Success when another request of its room has it on decode's
    ``request_status[room]``: ``update_status`` keeps the larger state, so a
    new receiver's Bootstrapping and WaitingForInput do not lower it (cc
    19:365-380, 21:415-433).  ``pop_preallocated`` does not run while a
    request waits retracted (the decode loop's return).  The run ends here
    (``State.crashed``)."""
    poll = receiver_poll(c, s, r)
    s = set_d(s, r, receiver_state=KVPoll.Failed, crashed=True)
    return s, (Crash(r, "decode", "ValueError", "_update_handshake_waiters",
                     f"unexpected poll case {poll.name}"),)


def _can_prealloc(c, s, r):
    """An entry the handshake found waiting is preallocated without another
    poll (``pop_preallocated`` reads ``waiting_for_input``, dc 19:1183,
    21:1348): on 0.5.19, if its room has since reached Success on decode and
    the handshake skipped its poll, it goes on to the transfer queue, which
    commits on that Success.  Nothing is preallocated when the handshake
    raises (``handshake_raises``), which ``pop_preallocated`` runs first, and
    nothing while a request waits retracted (the decode loop's return,
    ``processes.DECODE_LOOP``)."""
    req = s.d[r]
    # the cheap tests first: the handshake and slot passes scan the state
    return (req.stage is DStage.PREALLOC and req.receiver_state is KVPoll.WaitingForInput
            and len(s.free_d_pages()) - retracted_reserve(s)
            >= _prealloc_need(c, req, 1 if _radix_hit_possible(c, req) else 0)
            and not _scanned(c, s, r) and handshake_raises(c, s) is None
            and bool(slot_choices(s)))


def _radix_hit_possible(c: Ctx, req: DecodeReq) -> bool:
    """A decode prefix hit needs the decode radix cache, which a rebootstrap
    never uses (dc 21:1400-1403)."""
    return c.scenario.decode.radix_cache and req.origin_pages >= 2 and not req.rebootstrap


@action("decode", guard=_can_prealloc, needs=Needs(d={DStage.PREALLOC}), choices=_prealloc_choices,
        arg_names=("prefix", "pages", "slot"), optional_args=1)
def d_prealloc(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D2 ``pop_preallocated`` (dc 1080/1096/1231/1303/1333): ``_pre_alloc``
    (dc 1755/1811/2060/2166/2237) for D's own ``len(origin_input_ids)``, a D
    metadata slot, then ``send_metadata(pages, slot, decode_prefix_len)``
    (dc 1518/1566/1742/1805/1863).  From here P may write those pages.  The
    slot keeps whatever its rows hold (only a free resets them)."""
    prefix, chosen = arg[:2]
    req = s.d[r]
    slot = arg[2] if len(arg) > 2 else slot_choices(s)[0]
    # the same call first drops every finished entry (``d_prealloc_drop``)
    s, dropped = drop_scanned(c, s, _dropped(c, s))
    pages = list(s.d_pages)
    for pg in chosen:
        pages[pg] = replace(pages[pg], owner=r)
    slots = list(s.d_slots)
    slots[slot] = replace(slots[slot], owner=r)
    s = replace(s, d_pages=tuple(pages), d_slots=tuple(slots))
    s = set_d(s, r, stage=DStage.TRANSFER, pages=tuple(chosen), prefix_pages=prefix,
              meta_slot=slot)
    for k, q in channels(c):  # to every prefill rank the receiver bootstraps from
        s = send(s, Msg(MsgKind.metadata, r, pages=tuple(chosen), slot=slot, checksum=(prefix,),
                        rank=k, prank=q))
    if req.rebootstrap:  # submit_prefill_recompute (dc 21:1748-1752)
        s = send(s, Msg(MsgKind.recompute, r))
    return s, dropped + (Prealloc(r, "decode", is_aborted(req)),
                         Acquire(r, "decode", "kv"))


def _status_arrives(c, s, r):
    """A status report of request r's transfer is the next message of its
    prefill rank's channel, and decode still tracks the room."""
    return bool(arriving(c, s, "status", r)) and d_room_of(c, s, r).status is not None


def _arriving_ranks(c, s, r):
    return prank_args(c, sorted({m.prank for m in arriving(c, s, "status", r)}))


def _arriving_report(c: Ctx, s: State, r: int, arg) -> Msg:
    """Request r's status report from the prefill rank a step names, at the
    head of that rank's channel."""
    return next(m for m in arriving(c, s, "status", r) if m.prank == prank_of(arg))


@action("decode", guard=_status_arrives,
        needs=Needs(msgs={MsgKind.status}), choices=_arriving_ranks, arg_names=PRANK_ARG)
def d_recv_status(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Decode's ``decode_thread`` applies one prefill rank's status report on
    arrival (mc 19:2140-2206; ``decode_thread`` mc 20:2318, 21:2580,
    22:2971, 23:3043 calls ``apply_prefill_status`` cc 20:569-621,
    21:589-641, 22:784-841, 23:921-977): a Success counts the rank in the
    room's ``prefill_response_tracker`` and sets ``request_status[room]`` to
    Success once every prefill rank is in it; a Failed records the failure
    and sets Failed.  The report names the room and the rank, not the
    request, so it counts for whichever request tracks the room now."""
    msg = _arriving_report(c, s, r, arg)
    return apply_report(c, consume(s, msg), r, msg.prank, msg.poll, msg.rid), ()


def _late_status(c, s, r):
    return bool(arriving(c, s, "status", r)) and d_room_of(c, s, r).status is None


@action("decode", guard=_late_status,
        needs=Needs(msgs={MsgKind.status}), choices=_arriving_ranks, arg_names=PRANK_ARG)
def d_drop_late_status(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Decode's ``decode_thread`` drops a status report for a room it no
    longer tracks (``apply_prefill_status``: "Dropping late status for cleared
    room", cc 20:578-583, 23:930-935; 0.5.19 counts a Success only for a
    room in ``request_status`` and its ``update_status`` never re-creates a
    room as Failed, mc 19:2188-2206, cc 19:365-373)."""
    msg = _arriving_report(c, s, r, arg)
    return consume(s, msg), (StatusDropped(r, "decode"),)


def transfer_poll(c: Ctx, s: State, r: int) -> Optional[KVPoll]:
    """The transfer queue's poll of request r's receiver, through
    ``_apply_metadata_gate`` (ut 19:180-196, 20:212-228, 21:173-189,
    22:244-260, 23:245-261; ``poll_and_all_reduce`` applies it in every
    release before the MIN-reduce): a Success whose metadata slot still
    reads room 0, prefill's aux write not landed, is polled as Transferring,
    so the entry waits instead of committing."""
    poll = receiver_poll(c, s, r)
    if poll == KVPoll.Success and s.d_slots[s.d[r].meta_slot].room == 0:
        return KVPoll.Transferring
    return poll


def _transferred_ready(c, s, r):
    return (s.d[r].stage is DStage.TRANSFER
            and transfer_poll(c, s, r) in (KVPoll.Success, KVPoll.Failed)
            and not transfer_poll_raises(c, s))


@action("decode", guard=_transferred_ready, needs=Needs(d={DStage.TRANSFER}), seam="decode_commit")
def d_transferred(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D3 ``pop_transferred`` (dc 2245/2331/2616/2728/2833) polls the receiver
    (``request_status[room]``, which ``decode_thread`` set).  Success: the
    ``commit_check`` guard point on the slot's room
    (``_commit_transfer_to_req``; room 0 passes the metadata gate only on
    the fake transport, ``transfer_poll``), then the waiting queue and the
    slot freed.
    Failed: ``failure_exception()`` (which clears the room's status entry),
    ``prepare_abort(500)``, stream, then release now or hold until the drain
    ack (§5.5).  Not while a request waits retracted: ``process_decode_queue``
    returns before ``pop_transferred`` (the decode loop's return,
    ``processes.DECODE_LOOP``).  The call's poll first latches every other
    entry that reads Success or Failed (``latch_transfer_queue``), and
    nothing is handed on when that poll raises (``d_poll_popped_room``)."""
    s = latch_transfer_queue(c, s, but=r)
    req = s.d[r]
    if transfer_poll(c, s, r) == KVPoll.Success:
        counted = d_room_of(c, s, r).responded
        slot = s.d_slots[req.meta_slot]
        refused = c.release.commit_check(req, slot, room_id(c, r))
        if refused is None:
            # 0.5.23 skips the check on a layout-signature mismatch
            checksum = c.release.checksum
            expected = slot.checksum if (checksum and checksum.verified(c.scenario)) else None
            slots = list(s.d_slots)
            slots[req.meta_slot] = MetaSlot(owner=None, room=0, checksum=clear_checksum(c, slot),
                                            covered_pages=0)
            s = replace(s, d_slots=tuple(slots))
            s = set_d(receiver_clear(c, s, r), r, stage=DStage.WAITING, meta_slot=-1,
                      expected_checksum=expected, has_receiver=False, is_retracted=False,
                      rebootstrap=False)
            # info: the room the commit check compared against, and (history)
            # the (prefill rank, request) of each Success report counted, and
            # how many prefill ranks must report
            return s, (Commit(r, "decode", room_id(c, r), counted, c.scenario.prefill.ranks),)
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=refused,
                  cache_handle=False)
        s, evs = stream_d(s, r, refused)
        if slot.room != 0:  # room 0 is "not ready", not a corruption
            evs = (CorruptionAbort(r, "decode", "room"),) + evs
        return s, evs
    # failure_exception() latches Failed and clear()s: the room's status
    # entry is popped now, whoever else uses the room (dc 19:2284, 21:2657,
    # 22:2764, 23:2870; cc 23:2944-2946)
    reason = failure_reason(c, req)
    s = set_d(receiver_clear(c, s, r), r, finished_reason=reason, receiver_state=KVPoll.Failed)
    s, evs = stream_d(s, r, reason)
    holders: Tuple[int, ...] = ()
    if c.deferred:
        if c.release.hold_unnotified:  # ensure_abort_notified(force_arm=True) (dc 21:2692)
            s = notify_abort(c, s, r, all_ranks(c), arm=True)
            holders = all_ranks(c)
        else:  # 0.5.19/0.5.20: only a rank that notified P holds (dc 19:2305-2318)
            holders = s.d[r].notified
    if not holders:
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, cache_handle=False)
        return s, evs
    freed = tuple(k for k in all_ranks(c) if k not in holders)
    if freed:  # the other ranks release now
        evs += (RankRelease(r, "decode", freed),)
    s = set_d(s, r, stage=DStage.HELD, held=holders, released_on=freed)
    s, ev2 = resolve_held(c, s, r)
    return s, evs + ev2


def _status_popped(c, s, r):
    """A transfer-queue entry's poll of a popped room raises at every
    ``pop_transferred``; a prealloc-queue entry's only when the handshake
    polls (``handshake_raises``: 0.5.19 skips the poll while every entry waits
    and none concluded Failed, dc 19:871-879)."""
    req = s.d[r]
    if not req.has_receiver or receiver_poll(c, s, r) is not None:
        return False
    return req.stage is DStage.TRANSFER or (req.stage is DStage.PREALLOC
                                            and handshake_raises(c, s) == "KeyError")


@action("decode", guard=_status_popped,
        needs=Needs(d={DStage.TRANSFER, DStage.PREALLOC}), crash=True)
def d_poll_popped_room(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """A receiver polls a room whose ``request_status`` entry another request
    of the room has popped (its ``clear()``): ``check_status`` is
    ``request_status[room]`` (cc 19:362-363 ... 23:608-609) and raises
    KeyError, which neither ``pop_preallocated`` nor ``pop_transferred``
    catches (``poll_and_all_reduce``, utils 19:205-212): the decode
    scheduler's loop dies.  Neither runs while a request waits retracted
    (the decode loop's return, ``processes.DECODE_LOOP``).  The run ends here (``State.crashed``);
    ``no-poll-of-popped-room`` flags it."""
    s = set_d(s, r, receiver_state=KVPoll.Failed, crashed=True)
    return s, (poll_key_error(r, "decode"),)


def _d_digest(c: Ctx, s: State, r: int) -> Tuple:
    """D's digest over its own range (§5.8): the checksum matches P's only when
    every page of the range holds this request's KV and the lengths agree."""
    req = s.d[r]
    start = c.release.checksum.start(req.prefix_pages)
    length = req.origin_pages - start
    own = all(s.d_pages[p].written_by(r) for p in req.pages[max(start - req.prefix_pages, 0):])
    return (r, start, length) + layout_tag(c, "decode") if own else ("mismatch",)


def _prebuilt_ready(c, s, r):
    return s.d[r].stage is DStage.WAITING


@action("decode", guard=_prebuilt_ready, needs=Needs(d={DStage.WAITING}))
def d_attend(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D4 ``get_new_prebuilt_batch`` (dc 2592/2679/3023/3168/3273): 0.5.21+
    ``_verify_kv_checksums`` first when D expects a digest, then the decode
    forward attends over every page of the reserved range.  The digest is
    kept for the next prebuilt batch (a resume) unless the release verifies
    once (``KVChecksum.once``)."""
    req = s.d[r]
    if req.expected_checksum is not None and _d_digest(c, s, r) != req.expected_checksum:
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=ABORT_500,
                  cache_handle=False)
        s, evs = stream_d(s, r, ABORT_500)
        return s, (CorruptionAbort(r, "decode", "checksum"),) + evs
    foreign = tuple(p for p in req.pages if s.d_pages[p].foreign_to(r))
    once = c.release.checksum is None or c.release.checksum.once
    s = set_d(s, r, stage=DStage.RUNNING, expected_checksum=None if once else req.expected_checksum,
              read_foreign=req.read_foreign or bool(foreign))
    return s, (Read(r, "decode", foreign),)


def _running(c, s, r):
    return s.d[r].stage is DStage.RUNNING


@action("decode", guard=_running, needs=Needs(d={DStage.RUNNING}))
def d_respond(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """The decode step's ``update_finish_state`` (sb 1721/1843/1919/1913/2007)
    promotes a pending ``to_finish`` or finishes by length; the response is
    streamed and the request's pages and handle released."""
    req = s.d[r]
    reason = req.to_finish if req.to_finish is not None else (req.finished_reason or LENGTH)
    s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=reason, to_finish=None,
              cache_handle=False)
    return stream_d(s, r, reason, own=None if reason.is_abort else not req.read_foreign)


def _retractable(c, s, r):
    return s.d[r].stage is DStage.RUNNING and not s.d[r].was_retracted


@action("decode", guard=_retractable, needs=Needs(d={DStage.RUNNING}), event="retract")
def d_retract(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """R1 memory retract: ``retract_decode`` (sb 3030/3168/3297/3298/3451) ->
    ``release_req`` (sb 2036/2163/2239/2242/2360: host backup, release KV,
    ``reset_for_retract``) -> ``_add_request_to_queue(is_retracted=True)``
    (sch 3939/4171/4264/4416/4540)."""
    s = d_release(c, s, r)
    s = set_d(s, r, stage=DStage.DOOR, door_flag="retracted", is_retracted=True,
              retraction_backup=True, was_retracted=True)
    return s, (Release(r, "decode", "kv", True), Acquire(r, "decode", "backup"))


def _resumable(c, s, r):
    req = s.d[r]
    return req.stage is DStage.RETRACTED and len(s.free_d_pages()) >= req.origin_pages


def _resume_choices(c, s, r):
    return ((0, pages) for pages in page_choices(s, s.d[r].origin_pages))


@action("decode", guard=_resumable,
        needs=Needs(d={DStage.RETRACTED}), choices=_resume_choices, event="retract",
        arg_names=("prefix", "pages"), environment=False)
def d_resume(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """R5 ``resume_retracted_reqs`` (dc 804/829/950/997/1021): fresh ``_pre_alloc``,
    the host backup restored into the new pages, ``is_retracted=False``, then
    the waiting queue (no door)."""
    _, chosen = arg
    pages = list(s.d_pages)
    for pg in chosen:
        pages[pg] = replace(pages[pg], owner=r).all_written_by(r)
    s = replace(s, d_pages=tuple(pages))
    held = s.d[r].retraction_backup
    s = set_d(s, r, stage=DStage.WAITING, pages=tuple(chosen), prefix_pages=0,
              retraction_backup=False, is_retracted=False)
    # the backup is loaded into the new pages and its host memory freed
    return s, (Acquire(r, "decode", "kv"), Release(r, "decode", "backup", held))


def _pausable_one(c, s, k):
    req = s.d[k]
    if req.stage is not DStage.RUNNING or req.was_retracted:
        return False
    # with the overlap scheduler, pause_generation first processes the last
    # batch's result (sch 19:5132-5135, 20:5389-5392, 21:5603-5606,
    # 22:5618-5626, 23:5833-5841), whose update_finish_state promotes a
    # pending to_finish (sb 21:1919-1926): the request is finished (d_respond)
    # and not in retract_reqs (sch 19:5137, 20:5394, 21:5608, 22:5630, 23:5848)
    return not (c.scenario.decode.overlap_schedule and req.to_finish is not None)


def _running_batch(s):
    return [k for k, d in enumerate(s.d) if d.stage is DStage.RUNNING]


def _pausable(c, s, r):
    """The pause takes every running request at once (``retract_reqs`` is the
    whole running batch, sch 21:5608): the step is named by the first of them,
    and the model takes it only where it can retract each one (the
    scenario's ``preempt`` flag on, not yet re-entered, no pending finish that
    the overlap scheduler's last result would promote; that request is
    answered first, ``d_respond``, an order the code's pause also gives)."""
    running = _running_batch(s)
    return (bool(running) and running[0] == r
            and all(c.scenario.events.on("preempt", k) and _pausable_one(c, s, k)
                    for k in running))


@action("decode", guard=_pausable, needs=Needs(d={DStage.RUNNING}), event="preempt")
def d_pause_retract(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """R2 ``pause_generation(mode="retract")`` (sch 5180/5437/5655/5690/5908):
    ``_engine_paused`` is set and every running request is retracted
    (``retract_reqs``, sch 19:5137, 21:5608, 23:5848):
    ``retract_all(offload_kv=False)`` frees the KV without a host backup and
    ``reset_for_retract`` sets ``is_retracted``; ``hold_rebootstrap`` then, on
    ``continue_generation``, ``enqueue_held_rebootstrap`` ->
    ``add(is_rebootstrap=True)`` (dc 19:712-730, 21:848-867).  Until then the
    decode loop skips every phase after ingest (``processes.engine_paused``).
    Neither checks a pending ``to_finish``; only the overlap scheduler's
    last-batch processing, before the retract, promotes it (see the guard)."""
    evs = ()
    for k in _running_batch(s):
        s = d_release(c, s, k)
        s = set_d(s, k, stage=DStage.DOOR, door_flag="rebootstrap", is_retracted=True,
                  rebootstrap=True, was_retracted=True, read_foreign=False)
        evs += (Release(k, "decode", "kv", True),)
    return s, evs


def _recompute_requested(c, s, r):
    return bool(s.msgs("recompute", r)) and s.p[r].stage is PStage.GONE and not s.p[r].results_due


@action("prefill", guard=_recompute_requested,
        needs=Needs(p={PStage.GONE}, msgs={MsgKind.recompute}))
def p_recompute(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill receives decode's ``submit_prefill_recompute`` payload
    (``build_rebootstrap_payload``, dc 21:1748-1752): a new prefill ``Req`` for
    the same room, validated at P's intake like any request and dispatched to
    the bootstrap door (sch 2586/2724/2749/2820/2943)."""
    s = consume(s, s.msgs("recompute", r)[0])
    sc = c.scenario
    old = s.p[r]
    fields = validate_intake(sc.prefill, s.d[r].origin_pages)
    fresh = PrefillReq(stage=PStage.DOOR,  # the payload carries no session (sb 21:2077-2105)
                       cache_handle=c.release.has_cache_handle,
                       requeues_left=sc.optimistic_prefill_attempts, answer=old.answer,
                       **{**fields, "rejected": old.rejected or fields.get("rejected", False)})
    return replace(s, p=s.p[:r] + (fresh,) + s.p[r + 1:]), ()
