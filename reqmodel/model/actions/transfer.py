"""Prefill's transfer worker and KV manager: dequeuing chunks, the RDMA
writes into decode pages, transfer failures and stray writes, and the
receipt of decode's ABORT.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Tuple

from reqmodel.model.events import Write, XferSkip
from reqmodel.model.actions.core import action, CHANNEL_ARG, Ctx, Effect, Needs, PRANK_ARG, pranks
from reqmodel.model.actions.kvmanager import (conclude, handle_abort, layout_tag,
                                              maybe_ack_drained, names_instance,
                                              pop_transfer_infos, prefill_instance, room_id,
                                              room_of, set_room, takes_chunks)
from reqmodel.model.actions.transport import (arrival_of, consume, next_d_to_p,
                                              own_msg, own_ranks, prank_args, prank_of, rank_msgs,
                                              rank_of, send)
from reqmodel.model.state import DStage, KVPoll, Msg, MsgKind, PStage, replace, State


def _same_worker(c: Ctx, m: Msg, r: int, q: int) -> bool:
    """Message ``m`` is on the transfer queue and worker that take r's chunks
    on prefill rank q.  ``add_transfer_request`` puts a room's chunks on the
    queue its destination sessions pick (``shard_idx = session_port_sum %
    len(queues)``, mc 19:2243-2248, 21:2672-2677), and one worker thread
    drains each queue.  With ``transfer_queues = "shared"`` every request's
    chunks are on one queue per prefill rank: every room of the one decode
    instance names the same sessions.  With "per-request" each request has
    its own (another prefill instance's KV manager)."""
    return m.prank == q and (c.scenario.transfer_queues == "shared" or m.rid == r)


def _worker_busy(c: Ctx, s: State, r: int, q: int) -> bool:
    """The worker that takes r's chunks on rank q has a write in flight:
    ``batch_transfer_sync`` waits for it (mc 19:1760-1900)."""
    return any(m.kind == "write" and _same_worker(c, m, r, q) for m in s.net)


def worker_of(c: Ctx, r: int, q: int) -> Tuple[int, int]:
    """The transfer worker that takes r's chunks on prefill rank q, as
    ``State.workers_dead`` names it: (instance, rank)."""
    return prefill_instance(c, r), q


def worker_dead(c: Ctx, s: State, r: int, q: int) -> bool:
    """The thread of the worker that takes r's chunks on rank q has ended
    (``faults.xfer_worker_raises``)."""
    return bool(s.workers_dead) and worker_of(c, r, q) in s.workers_dead


def _chunk_next(c: Ctx, s: State, r: int, q: int) -> bool:
    """Prefill rank q's worker can take r's chunk: the worker's thread runs
    (``worker_dead``), r's chunk is the oldest on its queue and the worker has
    no write in flight."""
    if worker_dead(c, s, r, q) or _worker_busy(c, s, r, q):
        return False
    for m in s.net:
        if m.kind == "chunk" and _same_worker(c, m, r, q):
            return m.rid == r
    return False


def _queued_ranks(c, s, r):
    """Prefill ranks whose worker can take r's chunk (``_chunk_next``)."""
    if not s.net:
        return []
    return [q for q in pranks(c) if _chunk_next(c, s, r, q)]


def _chunk_queued(c, s, r):
    return bool(_queued_ranks(c, s, r))


def _sessions(c: Ctx, r: int, q: int) -> Tuple[Tuple[int, int, int], ...]:
    """The decode sessions prefill rank q's manager sends r's chunks to, as
    keys of ``State.failed_sessions``: one per decode rank (each rank's
    receiver registers its own Mooncake session, ``mooncake_session_id``)."""
    return tuple((prefill_instance(c, r), q, k) for k in range(c.scenario.decode.ranks))


def session_listed(c: Ctx, s: State, r: int, q: int) -> bool:
    """A decode session of r's destinations is on prefill rank q's
    ``failed_sessions``."""
    return bool(s.failed_sessions) and any(x in s.failed_sessions for x in _sessions(c, r, q))


def _list_sessions(c: Ctx, s: State, r: int, q: int) -> State:
    """``session_failures[sid] += 1`` and, at the first failure, ``failed_sessions.add(sid)``
    (mc 19:1869-1874 ... 23:2740-2745).  The model's write covers every decode
    rank's pages at once, so a failed batch lists every decode rank's session
    of the room (the code lists the rank whose write failed and does not try
    the later ones in that chunk)."""
    return replace(s, failed_sessions=tuple(sorted(set(s.failed_sessions)
                                                   | set(_sessions(c, r, q)))))


def _early_exit(c: Ctx, s: State, r: int, q: int) -> bool:
    """Prefill rank q's worker, taking r's chunk, finds a destination session
    on its failed list: the room is known and has decode's destinations
    (``transfer_infos[room]``, the requests the check runs over)."""
    return takes_chunks(room_of(c, s, r, q)) and session_listed(c, s, r, q)


def dequeue_ranks(c, s, r):
    """Prefill ranks whose worker can take r's chunk and write it (or skip
    it for a Failed or unknown room)."""
    return [q for q in _queued_ranks(c, s, r) if not _early_exit(c, s, r, q)]


def _can_dequeue(c, s, r):
    return bool(dequeue_ranks(c, s, r))


@action("transfer", guard=_can_dequeue,
        needs=Needs(msgs={MsgKind.chunk}),
        choices=lambda c, s, r: prank_args(c, dequeue_ranks(c, s, r)),
        arg_names=PRANK_ARG)
def xfer_dequeue(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Mooncake ``transfer_worker`` (mc 1645/1838/2080/2423/2488) takes the room's
    oldest chunk and counts it outstanding (``outstanding``).  A Failed or
    unknown room is skipped: the count is popped and a drained abort acked
    (mc 19:1678-1693).  A destination session on the failed list is
    ``xfer_session_failed``.  Otherwise the worker looks up decode's destinations
    now, ``dst_kv_indices[index_slice]`` (mc 1754/1939/2186/2550/2623; a short
    ``dst`` truncates the source, mc 19:1764-1775) and the aux slot, and the
    write is in flight: whatever happens to the room or to those pages from
    here on, ``xfer_write`` lands in them.  Each prefill rank has its own
    worker and moves its own heads."""
    q = prank_of(arg)
    msg = rank_msgs(s, "chunk", r, q)[0]
    s = consume(s, msg)
    room = room_of(c, s, r, q)
    if not takes_chunks(room):
        s = set_room(c, s, r, q=q, outstanding=0)
        return maybe_ack_drained(c, s, r, q), (XferSkip(r, "transfer"),)
    s = set_room(c, s, r, q=q, outstanding=room.outstanding + 1)
    a, b = msg.pages
    checksum, covered = None, 0
    if msg.last:
        if c.release.checksum and c.scenario.prefill.kv_checksum:
            checksum = _p_digest(c, s, r, q)
        covered = room.prefix + max(s.p[r].send_pages, 0)
    return send(s, Msg(MsgKind.write, r, pages=room.dst[a:b], last=msg.last, slot=room.dst_slot,
                       checksum=checksum, covered=covered, prank=q)), ()


def _write_in_flight(c, s, r):
    return bool(s.msgs("write", r))


def land_write(s: State, r: int, pages: Tuple[int, ...], q: int) -> Effect:
    """Prefill rank q's part of r's KV lands in decode pages ``pages``,
    whatever they hold now."""
    new = list(s.d_pages)
    for pg in pages:
        new[pg] = new[pg].with_slice(q, r)
    return replace(s, d_pages=tuple(new)), (Write(r, "transfer", pages),)


@action("transfer", guard=_write_in_flight,
        needs=Needs(msgs={MsgKind.write}),
        choices=lambda c, s, r: prank_args(c, own_ranks(s, "write", r)),
        arg_names=PRANK_ARG)
def xfer_write(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill rank q's write lands (``batch_transfer_sync``, mc 19:1760-1900) in
    the pages looked up at dequeue, whatever they hold now; on the last chunk
    it writes aux into decode's metadata slot (every prefill rank writes it,
    mc 22:2724-2733) and reports the room's status to D, naming its rank
    (``conclude_transfer`` from 0.5.20, cc 20:507); then ``worker_done``."""
    q = prank_of(arg)
    msg = own_msg(s, "write", r, q)
    s, evs = land_write(consume(s, msg), r, msg.pages, q)
    if msg.last:
        slot = msg.slot
        if 0 <= slot < len(s.d_slots):
            slots = list(s.d_slots)
            slots[slot] = replace(slots[slot], room=room_id(c, r), checksum=msg.checksum,
                                  covered_pages=msg.covered)
            s = replace(s, d_slots=tuple(slots))
        s = conclude(c, s, r, q, KVPoll.Success)
    return worker_done(c, s, r, msg.last, q), evs


def worker_done(c: Ctx, s: State, r: int, last: bool, q: int = 0) -> State:
    """The end of prefill rank q's worker iteration on one of the room's
    chunks: the outstanding count drops (mc 19:1970, 20:2143, 21:2393,
    22:2773, 23:2845), a drained abort is acked, and a concluded room with
    nothing outstanding is torn down (mc 19:1980-1991, 20:2153-2164,
    21:2403-2414, 22:2783-2793, 23:2855-2865)."""
    s = set_room(c, s, r, q=q, outstanding=room_of(c, s, r, q).outstanding - 1)
    s = maybe_ack_drained(c, s, r, q)
    room = room_of(c, s, r, q)
    if room.outstanding <= 0 and (room.status in (None, KVPoll.Success)
                                  or (last and room.status == KVPoll.Failed)):
        s = set_room(c, pop_transfer_infos(c, s, r, q), r, q=q, outstanding=0)
    return s


def _p_digest(c: Ctx, s: State, r: int, q: int = 0) -> Tuple:
    """P's KV checksum over its own range (§5.8): 0.5.21/22 ``[0, min(extend_end,
    len(origin)))``; 0.5.23 from ``disagg_decode_prefix_len``.  The digest of a
    range of P's own KV is modelled as (request, first page, length)."""
    req = s.p[r]
    start = c.release.checksum.start(room_of(c, s, r, q).prefix)
    return (r, start, min(req.extend_end, req.origin_pages) - start) + layout_tag(c, "prefill")


def _room_passed_on(c: Ctx, s: State, r: int) -> bool:
    """Request r's prefill has answered and the next request of its
    ``bootstrap_room`` has reached a worker: whatever opens the room from
    then on (the next sender's ``update_status(room, Bootstrapping)``, or its
    metadata re-creating a cleared room on the bootstrap thread) opens it for
    that request, not for r."""
    return s.p[r].answer is not None and any(
        c.scenario.previous_user(k) == r
        and (s.p[k].stage is not PStage.ABSENT or s.d[k].stage is not DStage.ABSENT)
        for k in range(c.scenario.n))


def _failing_ranks(c, s, r):
    """The prefill ranks where a transfer of request r's can fail now.  The
    transfer worker is the only place prefill records a failure
    (``record_failure`` + Failed, mc 19:1723-1729, 19:1876-1883,
    19:1907-1914 and their successors), and it does so for a chunk: when it
    takes r's chunk and finds decode's session failed ("Early exit if the
    request has failed"), or when the batch of r's write in flight fails.  So
    the room must be taking chunks for r and r's chunk be at the head of the
    worker's queue, or a write of r's be in flight (also once the next request
    of the room has opened it).  Before prefill's sender has queued a chunk
    nothing on prefill can fail the room but decode's ABORT
    (``p_recv_abort``).  A scenario's ``transfer_failure`` names requests, and
    a failure is one of r's own transfers, so a shared room's later
    lifecycles do not fail under r's name."""
    ours = not _room_passed_on(c, s, r)
    out = []
    for q in pranks(c):
        room = room_of(c, s, r, q)
        writing = any(m.rid == r for m in rank_msgs(s, "write", r, q))
        if (room.status in (KVPoll.WaitingForInput, KVPoll.Transferring) and room.dst is not None
                and (writing or (ours and _chunk_next(c, s, r, q)
                                 and not session_listed(c, s, r, q)))):
            out.append(q)
    return out


def _room_can_fail(c, s, r):
    return bool(_failing_ranks(c, s, r))


@action("transfer", guard=_room_can_fail,
        needs=Needs(msgs={MsgKind.chunk, MsgKind.write}), event="transfer_failure",
        choices=lambda c, s, r: prank_args(c, _failing_ranks(c, s, r)), arg_names=PRANK_ARG)
def xfer_fail(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """A transfer failure in the Mooncake ``transfer_worker`` (mc
    1645/1838/2080/2423/2488): ``record_failure``, room Failed, ``(room,
    Failed)`` sent to D.  With a write of the room in flight it is that
    write's batch that failed: ``batch_transfer_sync`` returns -1 on its
    timeout "with the batch still running ... so a failed send may still be
    writing decode's pages" (mc 22:2413-2421).  The worker gives up on it (the
    write becomes ``stray`` and lands whenever it lands), breaks out, and
    finishes the chunk as usual (``worker_done``); from 0.5.22 it first
    poisons the room, which then never acks (mc 22:2677, 22:2698).  The
    failed batch puts decode's session on the rank's failed list
    (``_list_sessions``).  Without a write in flight it is the worker taking
    r's chunk and finding decode's session already failed on traffic the
    scenario does not list (``_fail_chunk_early``; once the model's own
    failure has listed it, that is ``xfer_session_failed``, not this event).
    Only prefill rank q's KV manager fails; the others go
    on.  From 0.5.20 the record and the report go through
    ``conclude_failure``, which does nothing for a cleared room."""
    q = prank_of(arg)
    inflight = rank_msgs(s, "write", r, q)
    if not inflight:
        # decode's session failed on traffic the scenario does not list
        return _fail_chunk_early(c, _list_sessions(c, s, r, q), r, q)
    w = inflight[0]
    s = send(consume(s, w), Msg(MsgKind.stray, w.rid, pages=w.pages, prank=q))
    s = _list_sessions(c, s, r, q)
    if c.release.poison_failed_rooms:
        s = set_room(c, s, r, q=q, poisoned=True, ack_to=())
    s = conclude(c, s, r, q, KVPoll.Failed)
    return worker_done(c, s, r, w.last, q), ()


def _fail_chunk_early(c: Ctx, s: State, r: int, q: int) -> Effect:
    """The worker dequeues and counts r's chunk (mc 19:1670-1676), finds a
    destination session on its failed list ("Early exit if the request has
    failed", mc 19:1722-1736 ... 23:2583-2606): ``record_failure`` and Failed
    (``conclude_failure`` from 0.5.22), reported to decode; nothing written,
    nothing poisoned; the chunk finishes as usual (mc 19:1968-1991)."""
    chunk = rank_msgs(s, "chunk", r, q)[0]
    s = consume(s, chunk)
    s = set_room(c, s, r, q=q, outstanding=room_of(c, s, r, q).outstanding + 1)
    s = conclude(c, s, r, q, KVPoll.Failed)
    return worker_done(c, s, r, chunk.last, q), ()


def _early_exit_ranks(c, s, r):
    if not s.failed_sessions:
        return []
    return [q for q in _queued_ranks(c, s, r) if _early_exit(c, s, r, q)]


def _listed_chunk(c, s, r):
    return bool(_early_exit_ranks(c, s, r))


@action("transfer", guard=_listed_chunk, needs=Needs(msgs={MsgKind.chunk}),
        choices=lambda c, s, r: prank_args(c, _early_exit_ranks(c, s, r)), arg_names=PRANK_ARG)
def xfer_session_failed(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill rank q's worker takes r's chunk and a decode session it goes to
    is on the rank's failed list (an earlier batch to it failed, and no probe
    or re-registration has taken it off): the chunk fails at once
    (``_fail_chunk_early``; mc 19:1722-1736, 20:1911-1925, 21:2158-2172,
    22:2515-2534, 23:2583-2606), whatever the request.  Not an event of the
    scenario: it follows from the list."""
    return _fail_chunk_early(c, s, r, prank_of(arg))


def _probe_ranks(c, s, r):
    """Prefill ranks whose probe thread has a listed session to take off:
    with shared queues the pass is named by request 0, with per-request
    queues by the request whose instance it is."""
    if not s.failed_sessions or not c.failed_session_probe or not names_instance(c, r):
        return []
    inst = prefill_instance(c, r)
    return sorted({q for i, q, _ in s.failed_sessions if i == inst})


def _probe_due(c, s, r):
    return bool(_probe_ranks(c, s, r))


@action("prefill", guard=_probe_due,
        choices=lambda c, s, r: prank_args(c, _probe_ranks(c, s, r)), arg_names=PRANK_ARG)
def p_probe_failed_sessions(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """With ``SGLANG_ENABLE_FAILED_SESSION_PROBE`` (off by default up to
    0.5.22, on in 0.5.23), prefill rank q's probe thread runs a pass every
    ``SGLANG_FAILED_SESSION_PROBE_INTERVAL_S`` (30 s): it probes each listed
    session and takes the ones that answer off the list (mc 19:2276-2302 ...
    23:3154-3204; 0.5.23 also drops a session no request has targeted for
    600 s).  Decode is alive in the model, so every listed session answers.
    Untimed: the pass may come at any point after the failure, before the
    next chunk to that session or after it."""
    q = prank_of(arg)
    inst = prefill_instance(c, r)
    return replace(s, failed_sessions=tuple(x for x in s.failed_sessions
                                            if not (x[0] == inst and x[1] == q))), ()


def _stray_write(c, s, r):
    return bool(s.msgs("stray", r))


@action("transfer", guard=_stray_write, needs=Needs(msgs={MsgKind.stray}),
        choices=lambda c, s, r: prank_args(c, own_ranks(s, "stray", r)), arg_names=PRANK_ARG)
def xfer_stray_lands(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """A write the worker gave up on (``xfer_fail``) lands in decode's pages:
    the RDMA engine finishes the batch whatever prefill has decided since
    (mc 22:2413-2421: "a failed send may still be writing decode's pages")."""
    q = prank_of(arg)
    msg = own_msg(s, "stray", r, q)
    return land_write(consume(s, msg), r, msg.pages, q)


_abort_arrived, _abort_channels = arrival_of("abort")


@action("prefill", guard=_abort_arrived,
        needs=Needs(msgs={MsgKind.abort}), choices=_abort_channels, arg_names=CHANNEL_ARG)
def p_recv_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill rank q's bootstrap thread (mc 19:2006-2088) receives a decode
    rank's ABORT, the next message of that channel, and handles it
    (``handle_abort``; ``_handle_abort_notification`` mc 22:2814-2849)."""
    msg = next_d_to_p(c, s, r, rank_of(arg), prank_of(arg, 1))
    return handle_abort(c, consume(s, msg), msg), ()
