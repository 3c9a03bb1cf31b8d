"""The KV managers' bookkeeping, the way the code keeps it apart from the
schedulers: prefill's per-room ``request_status``, ``transfer_infos``,
failure records, staging counts and deferred ABORT_ACK targets
(``CommonKVManager``, cc), and decode's receiver, per-room status entry and
drain-ack tracker (``CommonKVReceiver``, ``_deferred_abort_ack_tracker``).

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Optional, Tuple

from reqmodel.model.actions.core import Ctx, pranks, set_d, set_p
from reqmodel.model.actions.transport import send
from reqmodel.model.state import (DRoom, DStage, KVPoll, Msg, MsgKind, PStage, replace, Room,
                                  State)


def room_of(c: Ctx, s: State, r: int, q: int = 0) -> Room:
    """Prefill rank q's KV manager entry for request r's ``bootstrap_room``
    (each prefill TP rank has its own KV manager)."""
    return s.rooms[s.room_index(r, q)]


def set_room(c: Ctx, s: State, r: int, *, q: int = 0, **kw) -> State:
    k = s.room_index(r, q)
    return replace(s, rooms=s.rooms[:k] + (replace(s.rooms[k], **kw),) + s.rooms[k + 1:])


def prefill_instance(c: Ctx, r: int) -> int:
    """The prefill instance that serves request r (its scheduler, KV managers
    and transfer workers), as ``State.failed_sessions`` and
    ``State.prefill_dead`` name it: -1, the one instance of shared transfer
    queues, or r, its own with "per-request" queues."""
    return -1 if c.scenario.transfer_queues == "shared" else r


def served_with(c: Ctx, r: int) -> Tuple[int, ...]:
    """The requests served by request r's prefill instance."""
    return tuple(range(c.scenario.n)) if c.scenario.transfer_queues == "shared" else (r,)


def names_instance(c: Ctx, r: int, event: str = "") -> bool:
    """Request r names its prefill instance for a step of the instance as a
    whole (a probe pass, a death, a node failure): with per-request queues
    every request has its own; with shared queues the one instance is named
    by the first request ``event`` lists (by request 0 for a step of the
    deployment's own)."""
    if c.scenario.transfer_queues != "shared":
        return True
    targets = getattr(c.scenario.events, event) if event else (0,)
    return bool(targets) and r == targets[0]


def d_room_of(c: Ctx, s: State, r: int) -> DRoom:
    """Decode's state (tracker, status entry) for request r's ``bootstrap_room``."""
    return s.d_rooms[s.room_slot(r)]


def set_d_room(c: Ctx, s: State, r: int, **kw) -> State:
    k = s.room_slot(r)
    return replace(s, d_rooms=s.d_rooms[:k] + (replace(s.d_rooms[k], **kw),) + s.d_rooms[k + 1:])


def receiver_init(c: Ctx, s: State, r: int) -> Tuple[State, KVPoll]:
    """``CommonKVReceiver.__init__`` and ``init()``: ``update_status(room,
    Bootstrapping)`` then ``WaitingForInput`` on decode's own
    ``request_status`` (cc 19:1381, 19:1418; 22:2196, 22:2254).  The entry is the
    room's: an entry another request of the room left behind merges by the
    release's rule (0.5.19 lets the new state replace Failed, 0.5.20+ keep
    Failed).  Returns the state the receiver's first poll will read.
    Where decode dropped the instance's registration at a node failure
    (``State.prefill_lost``) ``init()`` waits: the receiver stays
    Bootstrapping in ``pending_reqs`` (``_resolve_prefill_dp_rank`` finds no
    ``prefill_info_table`` entry, dc 19:645-652, 20:668-675, 21:776-784,
    22:827-834, 23:851-858)
    until a fetch registers it again (``faults.d_fetch_prefill_info``)."""
    st = d_room_of(c, s, r).status
    pending = bool(s.prefill_lost) and prefill_instance(c, r) in s.prefill_lost
    for new in (KVPoll.Bootstrapping,) if pending else (KVPoll.Bootstrapping,
                                                        KVPoll.WaitingForInput):
        st = c.release.update_status(st, new)
    return set_d_room(c, s, r, status=st), st


def receiver_fail(c: Ctx, s: State, r: int) -> State:
    """``update_status(room, Failed)`` on decode (``receiver.abort()``, the
    waiting timeout, a Failed report): never re-creates a popped entry."""
    st = d_room_of(c, s, r).status
    return set_d_room(c, s, r, status=c.release.update_status(st, KVPoll.Failed))


def receiver_poll(c: Ctx, s: State, r: int) -> Optional[KVPoll]:
    """``CommonKVReceiver.poll()``: the latched ``conclude_state`` if any, else
    ``check_status(room)``, i.e. ``request_status[room]`` (cc 19:2606-2616,
    22:2276-2279); None stands for the KeyError of a popped entry."""
    req = s.d[r]
    if req.receiver_state in (KVPoll.Success, KVPoll.Failed):
        return req.receiver_state
    return d_room_of(c, s, r).status


def receiver_unlatched(c: Ctx, s: State, u: int) -> bool:
    """Entry u is in decode's transfer queue and its receiver has latched
    nothing yet (its poll still reads the room's ``request_status``)."""
    d = s.d[u]
    return (d.stage is DStage.TRANSFER and d.has_receiver
            and d.receiver_state not in (KVPoll.Success, KVPoll.Failed))


def latch_transfer_queue(c: Ctx, s: State, but: int = -1) -> State:
    """The poll at the head of every ``pop_transferred`` call polls every
    transfer-queue entry before it handles any (``_poll_with_metadata_gate``
    over ``self.queue``, dc 19:2213, 20:2299, 21:2577, 22:2685, 23:2784),
    and a receiver's ``poll()`` latches a Success or Failed
    it reads into ``conclude_state`` (mc 19:2606-2611, 21:3031-3037; the
    metadata gate downgrades the scan's copy, not the latch, ut 21:173-189).
    An entry latched this way keeps reading what it read after another
    request of its room pops the room's ``request_status`` entry.  ``but``:
    the entry the call hands on, whose receiver the step drops anyway.
    Only entries whose room another live receiver shares are latched here:
    elsewhere only the entry's own steps change its room's entry after a
    Success or Failed, so the latch changes nothing a later poll would not
    read (latching every entry moved no verdict and grew the state counts
    by up to 60 %, notes/design.md)."""
    for u in range(len(s.d)):
        if u != but and receiver_unlatched(c, s, u) and room_shared_on_decode(c, s, u):
            st = d_room_of(c, s, u).status
            if st in (KVPoll.Success, KVPoll.Failed):
                s = set_d(s, u, receiver_state=st)
    return s


def room_shared_on_decode(c: Ctx, s: State, u: int) -> bool:
    """Another request of u's room has a receiver on decode: the only way
    the room's ``request_status`` entry can change under u once it reads
    Success (a single user's entry changes then only by u's own steps)."""
    k = s.room_slot(u)
    return any(v != u and d.has_receiver and s.room_slot(v) == k for v, d in enumerate(s.d))


def room_shared_on_prefill(c: Ctx, s: State, u: int) -> bool:
    """Another request of u's room has a sender on prefill."""
    k = s.room_slot(u)
    return any(v != u and p.has_sender and p.stage is not PStage.GONE and s.room_slot(v) == k
               for v, p in enumerate(s.p))


def transfer_poll_raises(c: Ctx, s: State) -> bool:
    """The same poll raises KeyError when an entry's receiver, not latched,
    finds its room's ``request_status`` entry popped (``check_status``, cc
    19:362-363 ... 23:608-609): the call ends there and hands on nothing
    (``d_poll_popped_room``)."""
    return any(receiver_unlatched(c, s, u) and d_room_of(c, s, u).status is None
               for u in range(len(s.d)))


def receiver_clear(c: Ctx, s: State, r: int) -> State:
    """``CommonKVReceiver.clear()`` pops ``request_status[room]`` (with the
    response tracker), whichever request of the room created it (cc
    19:1622-1624, 20:1850, 21:2009, 22:2543, 23:2935)."""
    return set_d_room(c, s, r, status=None, responded=())


def room_id(c: Ctx, r: int) -> int:
    return c.scenario.room_id(r)


def sender_poll(c: Ctx, s: State, r: int) -> Optional[KVPoll]:
    """Sender poll (mc 19:2399-2419): the latched conclude_state, else
    ``request_status[room]``, with Success reported as Transferring while
    chunks of the room are still outstanding.  With several prefill ranks the
    scheduler MIN-reduces the ranks' polls over the attention-TP group
    (``poll_and_all_reduce_attn_cp_tp_group``, ut 19:220-231; pf 19:452,
    20:467, 21:492, 22:482, 23:517), so it sees Success only once every rank
    has it and Failed as soon as one has."""
    if s.p[r].concluded is not None:
        return s.p[r].concluded
    polls = []
    for q in pranks(c):
        room = room_of(c, s, r, q)
        if room.status is None and c.release.sender_poll_missing_room_fails:
            polls.append(KVPoll.Failed)  # 0.5.23: a missing entry polls Failed (cc 23:2353-2356)
            continue
        polls.append(KVPoll.Transferring if room.status == KVPoll.Success
                     and outstanding(c, s, r, q) else room.status)
    return None if None in polls else min(polls)


def _sender_unlatched(c: Ctx, s: State, u: int, stage) -> bool:
    p = s.p[u]
    return p.stage is stage and p.has_sender and p.concluded is None


def latch_senders(c: Ctx, s: State, stage, but: int = -1) -> State:
    """The poll at the head of ``pop_bootstrapped`` and of
    ``process_disagg_prefill_inflight_queue`` polls every sender of its queue
    before it handles any (``poll_and_all_reduce_attn_cp_tp_group`` over the
    queue, pf 21:475-492, 21:1017-1021; the same in every release), and a
    sender's ``poll()`` latches a Success or Failed it reads into
    ``conclude_state`` (mc 19:2399-2411, 21:2820-2838; a Success with chunks
    still counted outstanding reads Transferring and is not latched).  With
    several prefill ranks each rank's sender latches its own; the model
    latches the reduced poll once every rank's reads the same end (a rank
    that latched alone is not followed).  As on decode, only entries whose
    room another live sender shares: a single user's latch is left to its
    own poll, which over-approximates (a decode ABORT that fails the room
    after its Success is read as Failed where the code's earlier scan may
    have latched the Success)."""
    for u in range(len(s.p)):
        if u != but and _sender_unlatched(c, s, u, stage) and room_shared_on_prefill(c, s, u):
            got = sender_poll(c, s, u)
            if got in (KVPoll.Success, KVPoll.Failed):
                s = set_p(s, u, concluded=got)
    return s


def sender_scan_raises(c: Ctx, s: State, stage) -> bool:
    """That poll raises KeyError when a sender of the queue, not latched,
    finds its room's entry popped (``p_poll_popped_room``; 0.5.23 polls
    Failed instead): the call ends there and hands nothing on."""
    return any(_sender_unlatched(c, s, u, stage) and sender_poll(c, s, u) is None
               for u in range(len(s.p)))


def update_status(ctx: Ctx, s: State, r: int, new: KVPoll, q: int = 0) -> State:
    """``update_status(room, new)`` on prefill rank q's KV manager."""
    room = room_of(ctx, s, r, q)
    status = ctx.release.update_status(room.status, new)
    if room.status is None and status is not None and ctx.release.new_room_drops_acks:
        # a new room lifecycle drops the ack state and the outstanding count
        # of the room's last user (cc 22:570-574)
        return set_room(ctx, s, r, q=q, status=status, ack_to=(), poisoned=False, outstanding=0)
    return set_room(ctx, s, r, q=q, status=status)


def conclude(c: Ctx, s: State, r: int, q: int, status: KVPoll) -> State:
    """The end of prefill rank q's transfer of the room, Success or Failed:
    ``conclude_transfer`` from 0.5.20 (cc 20:507-567, 21:527-587,
    22:718-767, 23:855-919) does nothing for a room the sender has cleared
    ("Concluding now would re-create it"), turns a Success into Failed when
    the room has a failure record or is Failed, keeps or makes the record of
    a Failed (``failure_records.setdefault``), then ``update_status`` and the
    status report to decode.  0.5.19's transfer worker makes the same calls
    inline without those checks (``record_failure`` + Failed, or
    ``update_status(Success)``, and the report: mc 19:1723-1736,
    19:1930-1945)."""
    room = room_of(c, s, r, q)
    if c.release.conclude_transfer:
        if room.status is None:
            return s
        if status == KVPoll.Success and (room.failure_record or room.status == KVPoll.Failed):
            status = KVPoll.Failed
    if status == KVPoll.Failed:
        s = record_failure(c, s, r, q)
    else:
        s = update_status(c, s, r, status, q)
    return send(s, Msg(MsgKind.status, r, poll=status, prank=q))


def handle_abort(c: Ctx, s: State, msg: Msg) -> State:
    """Prefill rank ``msg.prank``'s bootstrap thread handles decode rank
    ``msg.rank``'s ABORT for request ``msg.rid``'s room (mc 19:2022-2088,
    20:2195, 21:2449-2522; ``_handle_abort_notification`` mc 22:2814-2849,
    23:2886-2955).  An active room (present, not Success) becomes Failed.
    Without deferral P replies with a 2-frame ack that decode never counts
    (mc 19:2173-2180), so nothing is modelled.  With deferral the release's
    ``ack_targets`` policy decides whether the ABORT registers a target (then
    a drained room is acked at once) or, unregistered, is acked at once on a
    drained room."""
    r, k, q = msg.rid, msg.rank, msg.prank
    room = room_of(c, s, r, q)
    active = room.status is not None and room.status != KVPoll.Success
    busy = outstanding(c, s, r, q)
    if active:
        s = update_status(c, s, r, KVPoll.Failed, q)
    if not c.deferred:
        return s
    policy = c.release.ack_targets
    if policy.registers(msg.gen, active, busy, c.release.ack_generations):
        return maybe_ack_drained(c, register_ack_target(c, s, msg), r, q)
    if policy.acks_at_once and not busy:
        s = send(s, Msg(MsgKind.ack, r, rank=k, prank=q))
    return s


def apply_report(c: Ctx, s: State, r: int, q: int, poll: KVPoll, origin: int) -> State:
    """Decode applies prefill rank q's status report for request r's room
    (``apply_prefill_status``, cc 20:569-621, 21:589-641, 22:784-841,
    23:921-977; 0.5.19 inline in ``decode_thread``, mc 19:2140-2206): a
    Success counts the rank in ``prefill_response_tracker[room]`` and sets
    Success once every prefill rank is in it; a Failed sets Failed.  A room
    decode no longer tracks is left alone ("Dropping late status for cleared
    room").  ``origin`` (history) is the request whose transfer reported."""
    t = d_room_of(c, s, r)
    if t.status is None:
        return s
    if poll != KVPoll.Success:
        return receiver_fail(c, s, r)
    responded = tuple(sorted({x for x in t.responded if x[0] != q} | {(q, origin)}))
    s = set_d_room(c, s, r, responded=responded)
    if len(responded) >= c.scenario.prefill.ranks:
        s = set_d_room(c, s, r, status=c.release.update_status(t.status, KVPoll.Success))
    return s


def note_ack(c: Ctx, s: State, r: int, k: int, q: int, gen: int) -> Tuple[State, bool]:
    """Decode rank k counts prefill rank q's ABORT_ACK for request r's room
    (``note_abort_ack``, cc 19:391-396; 0.5.22+ with the generation,
    ``handle_abort_ack_message`` cc 22:853-876): only while the room's
    tracker on that rank is armed and, from 0.5.22, for the generation it
    armed.  The tracker is a set of prefill ranks.  Returns whether it
    counted."""
    t = d_room_of(c, s, r)
    armed = {rank: g for rank, g, _ in t.armed}
    if k not in armed or (c.release.ack_generations and (gen == 0 or armed[k] != gen)):
        return s, False
    if q not in t.acked_by(k):
        s = set_d_room(c, s, r, acked=tuple(sorted(t.acked + ((k, q, r),))))
    return s, True


def release_safe(c: Ctx, t: DRoom, k: int) -> bool:
    """``is_abort_release_safe(room, required_acks)`` on decode rank k: its
    tracker for the room has an ack from every prefill rank it bootstrapped
    from (``required_acks = len(bootstrap_infos)``, dc 19:2416, 22:2894-2898)."""
    return len(t.acked_by(k)) >= c.scenario.prefill.ranks


def sender_abort(ctx: Ctx, s: State, r: int) -> State:
    """``CommonKVSender.abort`` (cc 1350/1578/1711/2147/2458) on every prefill
    rank (the scheduler runs it on each): record a failure, set Failed, latch
    ``conclude_state = Failed``.  Sends nothing to D."""
    for q in pranks(ctx):
        s = record_failure(ctx, s, r, q)
    return set_p(s, r, concluded=KVPoll.Failed)


def record_failure(c: Ctx, s: State, r: int, q: int = 0) -> State:
    """``record_failure(room)`` and ``update_status(room, Failed)`` on prefill
    rank q's KV manager."""
    return set_room(c, update_status(c, s, r, KVPoll.Failed, q), r, q=q, failure_record=True)


def pop_transfer_infos(c: Ctx, s: State, r: int, q: int = 0) -> State:
    """Pop ``transfer_infos[room]`` (decode's destinations, its peers) and
    ``req_to_decode_prefix_len[room]`` on prefill rank q."""
    return set_room(c, s, r, q=q, dst=None, dst_slot=-1, prefix=0, peers=())


def sender_clear(c: Ctx, s: State, r: int) -> State:
    """``CommonKVSender.clear`` on every prefill rank (``clear_rank``)."""
    for q in pranks(c):
        s = clear_rank(c, s, r, q)
    return s


def clear_rank(c: Ctx, s: State, r: int, q: int) -> State:
    """``CommonKVSender.clear`` on prefill rank q: pop request_status,
    transfer_infos, prefix.  The room's ack target: 0.5.19/0.5.20 drop it (cc
    19:1345-1348), 0.5.21+ ack it if the room has drained and keep it
    otherwise (cc 21:1700-1709, 23:2409-2430)."""
    s = set_room(c, pop_transfer_infos(c, s, r, q), r, q=q, status=None)
    if c.release.clear_drops_ack_target:
        return set_room(c, s, r, q=q, ack_to=())
    return maybe_ack_drained(c, s, r, q)


def failure_exception(c: Ctx, s: State, r: int) -> State:
    """``failure_exception()`` on every prefill rank (``failure_exception_rank``)."""
    for q in pranks(c):
        s = failure_exception_rank(c, s, r, q)
    return s


def failure_exception_rank(c: Ctx, s: State, r: int, q: int) -> State:
    """``failure_exception()`` on prefill rank q: clear(), pop
    failure_records[room], raise (mc 19:2324-2338, 22:3130-3144; cc
    23:2446-2456)."""
    return set_room(c, clear_rank(c, s, r, q), r, q=q, failure_record=False)


def takes_chunks(room: Room) -> bool:
    """The KV manager moves a chunk only for a room it knows, not Failed, with
    decode's destinations: when queuing it (``add_transfer_request``, mc
    19:2214-2240 ... 23:3081-3111) and again when the worker dequeues it
    (mc 19:1679-1680)."""
    return room.status not in (None, KVPoll.Failed) and room.dst is not None


def outstanding(c: Ctx, s: State, r: int, q: int = 0) -> bool:
    """``_staging_outstanding[room] > 0`` on prefill rank q.  The worker counts
    a chunk when it dequeues it, "so `outstanding == 0` means nothing is
    dequeued or in flight" (mc 19:1670-1676, 20:1863-1869, 21:2110-2116,
    22:2454-2460, 23:2519-2525): a chunk still in the queue does not count."""
    return room_of(c, s, r, q).outstanding > 0


def maybe_ack_drained(c: Ctx, s: State, r: int, q: int = 0) -> State:
    """``_maybe_ack_drained_abort`` (cc 19:432-439, 21:705-727, 22:908-925) on
    prefill rank q: once no chunk of the room is outstanding, the registered
    targets get their ABORT_ACK, which names the prefill rank (0.5.21 also
    every ``transfer_infos`` peer); a poisoned room never acks."""
    room = room_of(c, s, r, q)
    if not room.ack_to or outstanding(c, s, r, q):
        return s
    s = set_room(c, s, r, q=q, ack_to=())
    if room.poisoned:
        return s
    targets = c.release.ack_targets.on_drain(room)
    for k in sorted(targets):
        gen, origin = targets[k]
        s = send(s, Msg(MsgKind.ack, origin, rank=k, gen=gen, prank=q))
    return s


def register_ack_target(c: Ctx, s: State, msg: Msg) -> State:
    """``register_deferred_ack_target`` for the ABORT ``msg``: 0.5.19/0.5.20 keep
    one target per room, overwritten by a later ABORT (cc 19:441-447); 0.5.21
    also snapshots the room's ``transfer_infos`` peers (cc 21:729-739); 0.5.22+
    keep one target per decode endpoint with its generation, none for a
    poisoned room (cc 22:927-943).  Each target remembers (as history) the
    decode request whose ABORT registered it."""
    r, rank, gen, q = msg.rid, msg.rank, msg.gen, msg.prank
    targets = c.release.ack_targets.register(room_of(c, s, r, q), rank, gen, r)
    return s if targets is None else set_room(c, s, r, q=q, ack_to=targets)


def all_ranks(c: Ctx) -> Tuple[int, ...]:
    return tuple(range(c.scenario.decode.ranks))


def notify_abort(c: Ctx, s: State, r: int, ranks: Tuple[int, ...], arm: bool) -> State:
    """``receiver.abort`` / ``ensure_abort_notified`` on the given decode ranks:
    each rank not yet notified sends ABORT once (cc 19:1626-1640).  With ``arm``
    and deferral on, it first registers the room's drain-ack tracker on that
    rank with a fresh set (``register_deferred_abort_room``; 0.5.22+ under a new
    generation, which the ABORT carries, cc 22:843-851)."""
    req = s.d[r]
    new = tuple(k for k in ranks if k not in req.notified)
    if not new:
        return s
    arming = arm and c.deferred
    for k in new:
        gen = 0
        if arming:
            gen = fresh_generation(c, s, r) if c.release.ack_generations else 0
            s = arm_tracker(c, s, r, k, gen)
        for q in pranks(c):  # to every prefill rank of its bootstrap_infos
            s = send(s, Msg(MsgKind.abort, r, rank=k, gen=gen, prank=q))
    return set_d(s, r, notified=tuple(sorted(set(req.notified) | set(new))))


def arm_tracker(c: Ctx, s: State, r: int, rank: int, gen: int) -> State:
    """``register_deferred_abort_room(room)`` on one decode rank: the room's
    tracker becomes a fresh set (cc 19:386-389: "a fresh set wipes stale acks
    from a prior request that reused this bootstrap_room"), owned by r."""
    t = d_room_of(c, s, r)
    armed = tuple(sorted([a for a in t.armed if a[0] != rank] + [(rank, gen, r)]))
    return set_d_room(c, s, r, armed=armed, acked=tuple(a for a in t.acked if a[0] != rank))


def fresh_generation(c: Ctx, s: State, r: int) -> int:
    """A generation no ABORT, target, tracker or ack of r's room carries yet:
    decode's counter is global and only grows (cc 22:845)."""
    used = [a[1] for a in d_room_of(c, s, r).armed]
    used += [t[1] for q in pranks(c) for t in room_of(c, s, r, q).ack_to]
    k = s.room_slot(r)
    used += [m.gen for m in s.net if m.kind in ("abort", "ack") and s.room_slot(m.rid) == k]
    return max(used, default=0) + 1


def layout_tag(c: Ctx, side: str) -> Tuple:
    """A digest covers the worker's own KV buffers (``KvChecksumComputer``
    over ``kv_data_ptrs``, checksum 21:82-120): with another TP width, PP
    stage, page size or dtype on the two workers (``layouts_match = false``)
    the same KV gives different digests.  () where they match."""
    return () if c.scenario.layouts_match else (side,)
