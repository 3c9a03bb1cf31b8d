"""The prefill worker's scheduler: the door (``PrefillBootstrapQueue.add``),
bootstrap, the waiting queue, chunked prefill, result processing and the
inflight queue.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Tuple

from reqmodel.model import guards as g
from reqmodel.model.events import (Acquire, Crash, DoorRetire, LateEffect, Release, Requeue, Send,
                                   poll_key_error)
from reqmodel.model.actions.core import (action, CHANNEL_ARG, Ctx, Effect, Event, Needs, pranks,
                                         set_p)
from reqmodel.model.actions.kvmanager import (failure_exception, room_of, sender_abort,
                                              latch_senders, sender_clear, sender_poll,
                                              sender_scan_raises, set_room, takes_chunks,
                                              update_status)
from reqmodel.model.actions.req import (failure_reason, p_free_metadata, p_release_kv, promote,
                                        run_retire_cleanup, session_turn_aborted, stream_p)
from reqmodel.model.actions.transport import (arrival_of, consume, next_d_to_p,
                                              prank_of, rank_of, send)
from reqmodel.model.guards import is_aborted
from reqmodel.model.state import ABORT_400, ABORT_500, KVPoll, Msg, MsgKind, PStage, State


def _at_p_door(c, s, r):
    return s.p[r].stage is PStage.DOOR


@action("prefill", guard=_at_p_door, needs=Needs(p={PStage.DOOR}), seam="prefill_door")
def p_door(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P1 ``PrefillBootstrapQueue.add`` (pf 385/399/417/429/452): the release's
    ``prefill_door`` guard point, then ``create_sender`` (pf 326/340/357/373/396)
    whose capacity check reads ``len(origin_input_ids)`` against the pool
    (<=0.5.22) or ``max_input_len`` (0.5.23, pf 23:148-155)."""
    req = s.p[r]
    rel = c.release
    if rel.prefill_door(req):
        reentering = req.is_retracted or req.holds_kv or req.holds_metadata
        s = set_p(s, r, stage=PStage.GONE, **run_retire_cleanup(c, req, rel.retire_cleanup))
        evs = (DoorRetire(r, "prefill", reentering),)
        if "stream" in rel.retire_cleanup:
            s, ev2 = stream_p(s, r, s.p[r].finished_reason or ABORT_400)
            evs += ev2
        return s, evs
    limit = rel.sender_capacity.limit(c.scenario)
    if req.origin_pages > limit:
        s = set_p(s, r, stage=PStage.GONE, finished_reason=ABORT_400, **session_turn_aborted(c))
        return stream_p(s, r, ABORT_400)
    s = set_p(s, r, stage=PStage.BOOTSTRAP, has_sender=True, pending_bootstrap=True)
    for q in pranks(c):  # one sender per prefill rank
        s = update_status(c, s, r, KVPoll.Bootstrapping, q)
    return s, (Acquire(r, "prefill", "sender"),)


_metadata_arrived, _metadata_channels = arrival_of("metadata")


@action("prefill", guard=_metadata_arrived,
        needs=Needs(msgs={MsgKind.metadata}), choices=_metadata_channels, arg_names=CHANNEL_ARG)
def p_recv_metadata(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill rank q's bootstrap thread receives one decode rank's destinations
    (mc 19:2116-2135; 21:2551-2571; 23:3034): adds it to ``transfer_infos[room]``
    and, once every decode rank's (``required_dst_info_num``) has arrived, sets
    WaitingForInput through ``update_status``, whether or not a local sender
    exists.  Ranks allocate in lockstep, so each names the same page indices
    of its own pool."""
    k, q = rank_of(arg), prank_of(arg, 1)
    msg = next_d_to_p(c, s, r, k, q)
    s = consume(s, msg)
    peers = tuple(sorted(set(room_of(c, s, r, q).peers) | {k}))
    s = set_room(c, s, r, q=q, dst=msg.pages, dst_slot=msg.slot, peers=peers,
                 prefix=msg.checksum[0] if msg.checksum else 0)
    if len(peers) < c.scenario.decode.ranks:
        return s, ()
    return update_status(c, s, r, KVPoll.WaitingForInput, q), ()


def _can_take_metadata(c, s, r):
    return s.p[r].holds_metadata or s.p_metadata_used() < c.scenario.prefill.metadata_buffers


def _optimistic(c, s, r):
    return c.scenario.optimistic_prefill_attempts > 0 and not s.p[r].is_retracted


def _bootstrap_ready(c, s, r):
    if s.p[r].stage is not PStage.BOOTSTRAP or sender_scan_raises(c, s, PStage.BOOTSTRAP):
        return False
    poll = sender_poll(c, s, r)
    if poll == KVPoll.Failed:
        return True
    if poll == KVPoll.WaitingForInput:
        return _can_take_metadata(c, s, r)
    return poll == KVPoll.Bootstrapping and _optimistic(c, s, r) and _can_take_metadata(c, s, r)


def handle_bootstrap_failure(c: Ctx, s: State, r: int) -> Effect:
    """``handle_bootstrap_failure`` (pf 1021/1125/1182/1309/1352): clear the pending
    chunk, ``failure_exception()``, release KV/Mamba if held, free metadata,
    ``pending_bootstrap=False``, ``prepare_abort(500)``, stream.  Every caller
    acts on a poll that read Failed, and the sender's poll latched it
    (``conclude_state``, mc 19:2409-2411, cc 23:2370-2371): a later poll
    of the request (0.5.19 queues a late final result, pf 19:752-797) reads
    Failed, not the popped room."""
    reason = failure_reason(c, s.p[r])
    s = failure_exception(c, s, r)
    s, evs = p_release_kv(c, s, r, unconditional=False)
    s = set_p(p_free_metadata(s, r), r, pending_bootstrap=False, finished_reason=reason,
              stage=PStage.GONE, cache_handle=False, concluded=KVPoll.Failed,
              **session_turn_aborted(c))
    s, ev2 = stream_p(s, r, reason)
    return s, evs + ev2


def finalize_bootstrap(c: Ctx, s: State, r: int) -> Effect:
    """``ensure_metadata_buffer`` + ``finalize_bootstrap`` (pf 363/377/394/406/429):
    ``start_send_idx = decode_prefix_len``; ``sender.init(ceil((len(origin) -
    prefix)/page), idx)``; ``pending_bootstrap=False``."""
    req = s.p[r]
    evs = () if req.holds_metadata else (Acquire(r, "prefill", "metadata"),)
    prefix = room_of(c, s, r).prefix
    s = set_p(s, r, holds_metadata=True, pending_bootstrap=False,
              send_pages=max(req.origin_pages - prefix, 0), sent=max(req.sent, prefix))
    return s, evs + (Acquire(r, "prefill", "init"),)


@action("prefill", guard=_bootstrap_ready, needs=Needs(p={PStage.BOOTSTRAP}))
def p_pop_bootstrapped(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P2 ``pop_bootstrapped`` (pf 410/425/450/462/497): Failed ->
    ``handle_bootstrap_failure``; WaitingForInput -> ``finalize_bootstrap`` and the
    waiting queue; Bootstrapping with optimistic prefill allowed and not
    ``is_retracted`` -> metadata buffer, waiting queue, still pending.  The
    call's poll first latches every other entry's Success or Failed
    (``latch_senders``); nothing is handed on when it raises."""
    s = latch_senders(c, s, PStage.BOOTSTRAP, but=r)
    poll = sender_poll(c, s, r)
    if poll == KVPoll.Failed:
        return handle_bootstrap_failure(c, s, r)
    if poll == KVPoll.WaitingForInput:
        s, evs = finalize_bootstrap(c, s, r)
        return set_p(s, r, stage=PStage.WAITING), evs
    evs = () if s.p[r].holds_metadata else (Acquire(r, "prefill", "metadata"),)
    return set_p(s, r, stage=PStage.WAITING, holds_metadata=True), evs


def _waiting_resolvable(c, s, r):
    req = s.p[r]
    if req.stage is not PStage.WAITING or is_aborted(req):
        return False
    poll = sender_poll(c, s, r)
    return poll == KVPoll.Failed or (poll == KVPoll.WaitingForInput and req.pending_bootstrap)


@action("prefill", guard=_waiting_resolvable, needs=Needs(p={PStage.WAITING}))
def p_resolve_waiting(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P3 ``resolve_waiting_queue_bootstrap`` (pf 527/547/597/584/606): polls
    non-aborted waiting requests; Failed -> ``handle_bootstrap_failure``;
    WaitingForInput and still pending -> ``finalize_bootstrap``."""
    if sender_poll(c, s, r) == KVPoll.Failed:
        return handle_bootstrap_failure(c, s, r)
    return finalize_bootstrap(c, s, r)


def _chunk_len(c, req) -> int:
    return min(c.scenario.chunk(), req.origin_pages - req.extend_end)


def _has_bootstrapped_waiting(s: State, r: int) -> bool:
    """``has_bootstrapped_waiting_req`` (pf 19:562-566)."""
    return any(o.stage is PStage.WAITING and not o.pending_bootstrap and not is_aborted(o)
               for i, o in enumerate(s.p) if i != r)


def _can_forward(c, s, r):
    req = s.p[r]
    if req.stage is PStage.WAITING:
        pass
    elif req.stage is PStage.CHUNKED:
        if req.pending_chunked_abort:
            return False
        if req.pending_bootstrap:  # process_prefill_chunk kept it: still bootstrapping
            if sender_poll(c, s, r) != KVPoll.Bootstrapping or is_aborted(req):
                return False
            if _has_bootstrapped_waiting(s, r):
                return False
    else:
        return False
    if len(req.results_due) > 1:  # overlap: one batch in flight beyond the unprocessed one
        return False
    return s.p_pages_used() + _chunk_len(c, req) <= c.scenario.prefill.pool_pages


@action("prefill", guard=_can_forward, needs=Needs(p={PStage.WAITING, PStage.CHUNKED}))
def p_forward(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P3/P4 ``get_new_batch_prefill`` (sch 19:3615-3757) + forward (overlap
    scheduler, pf 19:599-640): allocate the
    chunk's pages and launch it; the result is processed later (P5).  A chunk
    that does not reach the end of the prompt leaves the request as
    ``chunked_req`` (``add_chunked_req``, schedule_policy 19:973)."""
    req = s.p[r]
    n = _chunk_len(c, req)
    end = req.extend_end + n
    stage = PStage.CHUNKED if end < req.origin_pages else PStage.FORWARDED
    s = set_p(s, r, kv_pages=req.kv_pages + n, extend_end=end, stage=stage,
              holds_mamba=c.scenario.hybrid_mamba, results_due=req.results_due + (end,))
    evs = (Acquire(r, "prefill", "forward"),)
    if not req.holds_kv:
        evs += (Acquire(r, "prefill", "kv"),)
    return s, evs


def _chunked_check(c, s, r):
    req = s.p[r]
    stages = (PStage.CHUNKED,) if loop_timing(c) else (PStage.CHUNKED, PStage.FORWARDED)
    if req.stage not in stages or not req.pending_bootstrap or req.pending_chunked_abort:
        return False
    poll = sender_poll(c, s, r)
    if poll in (KVPoll.Failed, KVPoll.WaitingForInput):
        return True
    return (req.stage is PStage.CHUNKED and poll == KVPoll.Bootstrapping
            and (is_aborted(req) or _has_bootstrapped_waiting(s, r)))


@action("prefill", guard=_chunked_check, needs=Needs(p={PStage.CHUNKED, PStage.FORWARDED}))
def p_check_chunked(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``process_prefill_chunk`` on ``chunked_req`` (pf 19:1087-1100):
    ``check_bootstrap``: Failed -> ``handle_bootstrap_failure`` and drop the chunked
    req; WaitingForInput -> ``finalize_bootstrap``; still bootstrapping and aborted,
    or another waiting request is bootstrapped -> ``chunked_req = None`` (under
    overlap the release-and-requeue waits for the middle result)."""
    poll = sender_poll(c, s, r)
    if poll == KVPoll.Failed:
        return handle_bootstrap_failure(c, s, r)
    if poll == KVPoll.WaitingForInput:
        return finalize_bootstrap(c, s, r)
    return set_p(s, r, stage=PStage.YIELDED), ()


def _chunked_abort_pending(c, s, r):
    return s.p[r].stage is PStage.CHUNKED and s.p[r].pending_chunked_abort


@action("prefill", guard=_chunked_abort_pending, needs=Needs(p={PStage.CHUNKED}))
def p_chunked_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``process_pending_chunked_abort`` (sch 3248/3459/3537/3650/3778):
    ``prepare_abort``, ``to_finish=None``, ``sender.abort()``, free metadata,
    ``pending_bootstrap=False``, ``release_kv_cache(is_insert=False)``,
    ``chunked_req=None``, abort sent to the tokenizer."""
    s = sender_abort(c, s, r)
    s, evs = p_release_kv(c, s, r, unconditional=True)
    s = set_p(p_free_metadata(s, r), r, finished_reason=c.abort_status, to_finish=None,
              pending_bootstrap=False, pending_chunked_abort=False, stage=PStage.GONE,
              cache_handle=False)
    s, ev2 = stream_p(s, r, c.abort_status)
    return s, evs + ev2


def send_kv_chunk(c: Ctx, s: State, r: int, end: int) -> Effect:
    """``send_kv_chunk`` (pf 19:1194-1240): send pages ``[start_send_idx, end)``;
    returns early when there is nothing after ``start_send_idx`` (a decode prefix
    hit covering the stub: no chunk, so no Success ever).  The sender marks the
    chunk *last* when it reaches ``num_kv_indices`` (cc 19:1289-1291), and the
    KV manager queues it only if the room ``takes_chunks``."""
    req = s.p[r]
    start = req.sent
    if start >= end:
        return s, ()
    prefix = room_of(c, s, r).prefix
    last = req.send_pages >= 0 and end - prefix >= req.send_pages
    s = set_p(s, r, sent=end)
    for q in pranks(c):  # every prefill rank's sender sends its own heads
        if takes_chunks(room_of(c, s, r, q)):
            s = send(s, Msg(MsgKind.chunk, r, pages=(start - prefix, end - prefix), last=last, prank=q))
    return s, (Send(r, "prefill", last, req.holds_metadata),)


def optimistic_release_and_requeue(c: Ctx, s: State, r: int) -> Effect:
    """``optimistic_release_and_requeue`` (pf 1352/1471/1545/1673/1789): cache and
    release KV, ``reset_for_retract``, ``pending_bootstrap=True``; front of the
    waiting queue, or once attempts are exhausted straight into the bootstrap
    queue (no door; 0.5.23 frees the metadata buffer there)."""
    req = s.p[r]
    s, evs = p_release_kv(c, s, r, unconditional=True)
    fields = dict(is_retracted=True, results_due=(), extend_end=0, sent=0,
                  pending_bootstrap=True)
    if req.requeues_left > 0:
        spent = 1 if c.release.requeue_spends_attempt else 0
        fields.update(stage=PStage.WAITING, requeues_left=req.requeues_left - spent)
    else:
        fields.update(stage=PStage.BOOTSTRAP)
        if c.release.requeue_fallback_frees_metadata:
            fields.update(holds_metadata=False)
    s = set_p(s, r, **fields)
    return s, evs + (Requeue(r, "prefill"),)


def retire_aborted_prefill_result(c: Ctx, s: State, r: int) -> Tuple[State, Tuple[Event, ...], bool]:
    """``_retire_aborted_prefill_result`` (pf 20:1096, 21:1154, 22:1281, 23:1324):
    returns False when the request owns no KV, Mamba or metadata; otherwise
    ``sender.abort()``, promote ``to_finish``, free metadata,
    ``pending_bootstrap=False``, HiCache ``finish(ABORT)``, release KV."""
    req = s.p[r]
    if not (req.holds_kv or req.holds_mamba or req.holds_metadata):
        return s, (), False
    if req.has_sender:
        s = sender_abort(c, s, r)
    s = set_p(p_free_metadata(s, r), r, pending_bootstrap=False, cache_handle=False,
              stage=PStage.GONE, **promote(req))
    s, evs = p_release_kv(c, s, r, unconditional=False)
    return s, evs, True


def loop_timing(c) -> bool:
    return c.scenario.result_timing == "loop"


def _result_due(c, s, r):
    req = s.p[r]
    if not req.results_due:
        return False
    # the overlap loop runs process_pending_chunked_abort (top of the step)
    # before it processes the last batch's result (pf 19:627-631)
    return not (loop_timing(c) and req.pending_chunked_abort)


@action("prefill", guard=_result_due, seam="prefill_result")
def p_result(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P5 ``process_batch_result_disagg_prefill`` (pf 684/705/763/858/901) for the
    oldest overlapped result of the request: the release's ``final_result`` and
    ``middle_result`` guard points decide between retire, requeue, drop and send."""
    req = s.p[r]
    end, rest = req.results_due[0], req.results_due[1:]
    was_gone = req.stage is PStage.GONE
    s = set_p(s, r, results_due=rest)
    req = s.p[r]
    evs: Tuple[Event, ...] = ()
    if end < req.origin_pages:  # ---------------------------------- middle chunk
        still_chunking = req.stage is PStage.CHUNKED or req.origin_pages in rest
        decision = c.release.middle_result(req, still_chunking)
        if decision == g.REQUEUE:
            s, evs = optimistic_release_and_requeue(c, s, r)
        elif decision == g.RETIRE:
            s, evs, retired = retire_aborted_prefill_result(c, s, r)
            if retired:
                s, ev2 = stream_p(s, r, s.p[r].finished_reason)
                evs += ev2
        elif decision == g.SEND and not req.pending_bootstrap:
            s, evs = send_kv_chunk(c, s, r, end)
        if req.stage is PStage.YIELDED and s.p[r].stage is PStage.YIELDED:
            s = set_p(s, r, stage=PStage.WAITING)  # yielded, nothing else to do: requeue
    else:  # ---------------------------------------------------------- final chunk
        if c.release.final_result(req):
            s, evs, retired = retire_aborted_prefill_result(c, s, r)
            if retired:
                s, ev2 = stream_p(s, r, s.p[r].finished_reason)
                evs += ev2
        else:
            # output token, maybe_cache_unfinished_req (pf 19:762): needs ownership
            evs = (Release(r, "prefill", "cache", req.holds_kv or req.holds_mamba),)
            s = set_p(s, r, stage=PStage.INFLIGHT)
            if not req.pending_bootstrap:
                s, ev2 = send_kv_chunk(c, s, r, end)
                evs += ev2
            evs += (Acquire(r, "prefill", "inflight"),)
    if was_gone:
        side = tuple(e for e in evs if e.kind in ("send", "acquire", "requeue", "release"))
        if side:
            evs += (LateEffect(r, "prefill", tuple(sorted({e.kind for e in side}))),)
    return s, evs


def _polls_popped_room(c, s, r):
    req = s.p[r]
    polled = (req.stage in (PStage.BOOTSTRAP, PStage.INFLIGHT)
              or (req.stage is PStage.WAITING and not is_aborted(req))
              or (req.stage is PStage.CHUNKED and req.pending_bootstrap))
    return (polled and req.has_sender and not c.release.sender_poll_missing_room_fails
            and sender_poll(c, s, r) is None)


@action("prefill", guard=_polls_popped_room,
        needs=Needs(p={PStage.BOOTSTRAP, PStage.INFLIGHT, PStage.WAITING, PStage.CHUNKED}),
        crash=True)
def p_poll_popped_room(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """A prefill sender polls a room whose ``request_status`` entry another
    request of the room has popped (its ``clear()`` or
    ``failure_exception()``): Mooncake's sender poll calls ``check_status``,
    ``request_status[room]`` (mc 19:2401, 20:2555, 21:2822, 22:3205), and the
    KeyError escapes ``poll_and_all_reduce`` (ut 19:205-217) into the
    bootstrap, waiting or inflight queue's loop (pf 19:452, 19:527, 19:876):
    the prefill scheduler dies.  0.5.23's ``CommonKVSender`` polls Failed
    instead (cc 23:2353-2356).  The run ends here (``State.crashed``)."""
    return set_p(s, r, concluded=KVPoll.Failed, crashed=True), (poll_key_error(r, "prefill"),)


def _unexpected_poll(c, s, r):
    """Where the scheduler raises on the poll it reads: the bootstrap queue on
    Transferring or Success; the inflight queue on Bootstrapping for a request
    not parked, and (``handle_pending_bootstrap``) on Transferring or Success
    for a parked one, or for the chunked request still bootstrapping, whose
    ``check_bootstrap`` ``process_prefill_chunk`` calls every iteration
    (pf 19:1091, 20:1195, 21:1252, 22:1379, 23:1422 -> pf 19:1065-1066,
    21:1226-1227, 23:1396-1397).  A waiting request still bootstrapping is
    polled by ``resolve_waiting_queue_bootstrap``, which has no branch for
    those states and leaves it (pf 21:611-623)."""
    req = s.p[r]
    if not req.has_sender or not (req.stage in (PStage.BOOTSTRAP, PStage.INFLIGHT)
                                  or (req.stage is PStage.CHUNKED and req.pending_bootstrap)):
        return None
    poll = sender_poll(c, s, r)
    if req.stage is PStage.BOOTSTRAP or req.pending_bootstrap:
        bad = poll in (KVPoll.Transferring, KVPoll.Success)
    else:
        bad = poll == KVPoll.Bootstrapping
    if not bad:
        return None
    if req.stage is PStage.BOOTSTRAP:
        return "pop_bootstrapped"
    return "handle_pending_bootstrap" if req.pending_bootstrap else "process_disagg_prefill_inflight_queue"


@action("prefill", guard=lambda c, s, r: _unexpected_poll(c, s, r) is not None,
        needs=Needs(p={PStage.BOOTSTRAP, PStage.INFLIGHT, PStage.CHUNKED}),
        crash=True)
def p_unexpected_poll(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """The prefill scheduler reads a poll state its queue has no branch for and
    raises ``RuntimeError("Unexpected poll state ...")``: ``pop_bootstrapped``
    on Transferring or Success (pf 19:488, 20:507, 21:537, 22:528, 23:550),
    the inflight queue on Bootstrapping for a request that is not parked (pf
    19:941, 20:1015, 21:1073, 22:1197, 23:1240), ``handle_pending_bootstrap``
    on Transferring or Success (pf 19:1065, 20:1169, 21:1226, 22:1353,
    23:1396).  Nothing catches it: the prefill scheduler dies.  A room entry
    another request of the room moved on (its late write's Success, its
    re-created sender) is how a request gets there.  The run ends here
    (``State.crashed``)."""
    where = _unexpected_poll(c, s, r)
    poll = sender_poll(c, s, r)
    return set_p(s, r, concluded=KVPoll.Failed, crashed=True), (
        Crash(r, "prefill", "RuntimeError", where, f"unexpected poll state {poll.name}"),)


def _inflight_ready(c, s, r):
    req = s.p[r]
    if req.stage is not PStage.INFLIGHT or sender_scan_raises(c, s, PStage.INFLIGHT):
        return False
    poll = sender_poll(c, s, r)
    if req.pending_bootstrap:
        return poll == KVPoll.Failed or poll == KVPoll.WaitingForInput
    return poll in (KVPoll.Success, KVPoll.Failed)


@action("prefill", guard=_inflight_ready, needs=Needs(p={PStage.INFLIGHT}), seam="prefill_inflight")
def p_inflight(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P6 ``process_disagg_prefill_inflight_queue`` (pf 876/947/1005/1108/1151).
    Parked (pending bootstrap): ``handle_pending_bootstrap`` then send.  Success:
    the ``inflight_success`` guard point sets ``finished_reason``,
    ``release_kv_cache`` (insert), ``sender.clear()``, stream, free metadata.
    Failed: ``handle_inflight_transfer_failure`` (pf 983/1057/1115/1239/1282).
    The call's poll first latches every other inflight sender's Success or
    Failed (``latch_senders``): a sample whose room another sample's
    transfer concluded is answered on that, whatever the room's entry
    becomes; nothing is handed on when the poll raises."""
    s = latch_senders(c, s, PStage.INFLIGHT, but=r)
    req = s.p[r]
    poll = sender_poll(c, s, r)
    if req.pending_bootstrap:
        if poll == KVPoll.Failed:
            return handle_bootstrap_failure(c, s, r)
        s, evs = finalize_bootstrap(c, s, r)
        s, ev2 = send_kv_chunk(c, s, r, s.p[r].extend_end)
        return s, evs + ev2
    if poll == KVPoll.Success:
        reason = c.release.inflight_success(req)
        s = set_p(s, r, finished_reason=reason)
        s, evs = p_release_kv(c, s, r, unconditional=True)
        s = sender_clear(c, s, r)
        s, ev2 = stream_p(s, r, reason)
        s = set_p(p_free_metadata(s, r), r, stage=PStage.GONE, cache_handle=False)
        return s, evs + ev2
    s = failure_exception(c, s, r)
    s, evs = p_release_kv(c, s, r, unconditional=True)
    if not (req.finished_reason is not None and req.finished_reason.is_abort):
        s = set_p(s, r, finished_reason=ABORT_500)
    s, ev2 = stream_p(s, r, s.p[r].finished_reason)
    s = set_p(p_free_metadata(s, r), r, stage=PStage.GONE, cache_handle=False)
    return s, evs + ev2
