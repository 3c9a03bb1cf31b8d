"""The actions of the transition system.

Every action is a small named function registered with :func:`action`, its
guard given first (in the decorator) and its effect in the body.  The effect
returns the next state and the *events* the step emitted (acquisitions,
releases, sends, reads, streams), which transition properties inspect.

Each action takes ``(ctx, state, rid, arg)``: the context (release record and
scenario), the state, the request it acts on, and an optional choice (pages
to allocate, prefix hit) that ``choices`` enumerates.  The exhaustive
explorer, the Hypothesis state machine and trace replay all iterate over
``ACTIONS``; none of them knows the protocol.

Release differences live in the release record (``ctx.release``), never in an
``if release >= ...`` here.  Docstrings cite the SGLang code each action
models, per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23).
"""
from __future__ import annotations

import itertools
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import attrs

from reqmodel.model import guards as g
from reqmodel.model.guards import is_aborted
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import (ABORT_400, ABORT_500, D_TO_P, LENGTH, DecodeReq, DRoom, DStage, Finish, KVPoll,
                    MetaSlot, Msg, Page, PrefillReq, PStage, Room, State, replace)


@attrs.frozen
class Ctx:
    release: Release
    scenario: Scenario

    @property
    def deferred(self) -> bool:
        d = self.scenario.deferred_release
        return self.release.deferred_release_default if d is None else d

    @property
    def abort_status(self) -> Finish:
        return Finish("abort", self.release.client_abort_status)


@attrs.frozen(order=True)
class Event:
    """Something a step did that a transition property may look at.

    kinds: acquire(resource) | release(resource, held) | send(last, has_metadata)
    | requeue | door_retire(reentering) | prealloc(aborted) | read(foreign)
    | late_effect(what) | stream(status)
    """

    kind: str
    rid: int
    side: str
    info: Tuple = ()


Effect = Tuple[State, Tuple[Event, ...]]


@attrs.frozen
class Action:
    name: str
    actor: str  # client | prefill | decode | transfer
    guard: Callable[[Ctx, State, int], bool]
    effect: Callable
    choices: Optional[Callable[[Ctx, State, int], Iterable[Tuple]]] = None
    event_flag: Optional[str] = None  # scenario.events flag that enables it
    arg_names: Tuple[str, ...] = ()  # names of the choice's components, for traces
    # how many trailing components a step may leave out (a one-rank scenario
    # names no decode rank; a metadata slot is named only when it is a choice)
    optional_args: int = 0

    @property
    def doc(self) -> str:
        return (self.effect.__doc__ or "").strip()

    def enabled(self, ctx: Ctx, s: State, rid: int) -> bool:
        if self.event_flag and not ctx.scenario.events.on(self.event_flag, rid):
            return False
        return self.guard(ctx, s, rid)

    def args(self, ctx: Ctx, s: State, rid: int) -> Iterable[Tuple]:
        return self.choices(ctx, s, rid) if self.choices else ((),)


RANK_ARG = ("rank",)  # the choice of actions that name a decode rank
PRANK_ARG = ("prefill_rank",)  # ... that name a prefill rank (its transfer worker)
CHANNEL_ARG = ("rank", "prefill_rank")  # ... that name a decode-prefill rank pair
ACTIONS: List[Action] = []
BY_NAME: Dict[str, Action] = {}


def action(actor: str, guard: Callable, choices: Callable = None, event: str = None,
           arg_names: Tuple[str, ...] = (), optional_args: int = 0):
    """Register an action: ``guard(ctx, s, rid) -> bool`` first, effect below."""
    def deco(fn):
        names = tuple(arg_names)
        a = Action(fn.__name__, actor, guard, fn, choices, event, names,
                   len(names) if names in (RANK_ARG, PRANK_ARG, CHANNEL_ARG) else optional_args)
        ACTIONS.append(a)
        BY_NAME[a.name] = a
        return fn
    return deco


# ---------------------------------------------------------------- helpers


def set_p(s: State, r: int, **kw) -> State:
    return replace(s, p=s.p[:r] + (replace(s.p[r], **kw),) + s.p[r + 1:])


def set_d(s: State, r: int, **kw) -> State:
    return replace(s, d=s.d[:r] + (replace(s.d[r], **kw),) + s.d[r + 1:])


def room_of(c: Ctx, s: State, r: int, q: int = 0) -> Room:
    """Prefill rank q's KV manager entry for request r's ``bootstrap_room``
    (each prefill TP rank has its own KV manager)."""
    return s.rooms[s.room_index(r, q)]


def set_room(c: Ctx, s: State, r: int, *, q: int = 0, **kw) -> State:
    k = s.room_index(r, q)
    return replace(s, rooms=s.rooms[:k] + (replace(s.rooms[k], **kw),) + s.rooms[k + 1:])


def pranks(c: Ctx) -> range:
    """The prefill ranks: one KV manager, transfer worker and page slice each."""
    return range(c.scenario.prefill.ranks)


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
    Failed).  Returns the state the receiver's first poll will read."""
    st = d_room_of(c, s, r).status
    for new in (KVPoll.Bootstrapping, KVPoll.WaitingForInput):
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


def receiver_clear(c: Ctx, s: State, r: int) -> State:
    """``CommonKVReceiver.clear()`` pops ``request_status[room]`` (with the
    response tracker), whichever request of the room created it (cc
    19:1622-1624, 20:1850, 21:2009, 22:2543, 23:2935)."""
    return set_d_room(c, s, r, status=None, responded=())


def send(s: State, msg: Msg) -> State:
    return replace(s, net=s.net + (msg,))


def consume(s: State, msg: Msg) -> State:
    i = s.net.index(msg)
    return replace(s, net=s.net[:i] + s.net[i + 1:])


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
        polls.append(KVPoll.Transferring if room.status == KVPoll.Success
                     and outstanding(c, s, r, q) else room.status)
    return None if None in polls else min(polls)


def update_status(ctx: Ctx, s: State, r: int, new: KVPoll, q: int = 0) -> State:
    """``update_status(room, new)`` on prefill rank q's KV manager."""
    room = room_of(ctx, s, r, q)
    status = ctx.release.update_status(room.status, new)
    if room.status is None and status is not None and ctx.release.new_room_drops_acks:
        # a new room lifecycle drops the ack state and the outstanding count
        # of the room's last user (cc 22:570-574)
        return set_room(ctx, s, r, q=q, status=status, ack_to=(), poisoned=False, outstanding=0)
    return set_room(ctx, s, r, q=q, status=status)


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
    """``CommonKVSender.clear`` on every prefill rank: pop request_status,
    transfer_infos, prefix.  The room's ack target: 0.5.19/0.5.20 drop it (cc
    19:1345-1348), 0.5.21+ ack it if the room has drained and keep it
    otherwise (cc 21:1700-1709)."""
    for q in pranks(c):
        s = set_room(c, pop_transfer_infos(c, s, r, q), r, q=q, status=None)
        if c.release.clear_drops_ack_target:
            s = set_room(c, s, r, q=q, ack_to=())
        else:
            s = _maybe_ack_drained(c, s, r, q)
    return s


def failure_exception(c: Ctx, s: State, r: int) -> State:
    """``failure_exception()``: clear(), pop failure_records[room], raise."""
    s = sender_clear(c, s, r)
    for q in pranks(c):
        s = set_room(c, s, r, q=q, failure_record=False)
    return s


def p_release_kv(s: State, r: int, unconditional: bool) -> Tuple[State, Tuple[Event, ...]]:
    """``release_kv_cache`` on P (memc 254/276/292/378/400).  An unconditional
    call on a request that holds nothing is recorded (0.5.19 asserts
    ``supports_mamba()`` there, memc 19:254-263)."""
    req = s.p[r]
    held = req.holds_kv or req.holds_mamba
    evs = (Event("release", r, "prefill", ("kv", held)),) if (held or unconditional) else ()
    return set_p(s, r, kv_pages=0, holds_mamba=False), evs


def p_free_metadata(s: State, r: int) -> State:
    """``maybe_release_metadata_buffer`` (pf 115/123/139/144/157): idempotent."""
    return set_p(s, r, holds_metadata=False)


def stream_p(s: State, r: int, status: int) -> Tuple[State, Tuple[Event, ...]]:
    req = s.p[r]
    s = set_p(s, r, answer=status if req.answer is None else req.answer)
    return s, (Event("stream", r, "prefill", (status,)),)


def stream_d(s: State, r: int, status: int, own: Optional[bool] = None) -> Tuple[State, Tuple[Event, ...]]:
    req = s.d[r]
    if req.answer is None:
        s = set_d(s, r, answer=status, own_data=own)
    return s, (Event("stream", r, "decode", (status,)),)


def promote(req) -> dict:
    """``Req.update_finish_state`` for a pending verdict: to_finish -> finished_reason."""
    if req.finished_reason is None and req.to_finish is not None:
        return dict(finished_reason=req.to_finish, to_finish=None)
    return {}


def validate_intake(worker, prompt: int) -> dict:
    """``validate_input_length`` (sch 2850/2990/3033/3119/3246) against the
    worker's own ``max_req_input_len``; on failure ``set_finish_with_abort``
    (sb 1927/2054/2130/2125/2221) or, with ``--allow-auto-truncate``, the cut
    of managers/utils.py 19:206-236."""
    if worker.rejects(prompt):
        return dict(origin_pages=1, to_finish=ABORT_400, rejected=True)
    return dict(origin_pages=min(prompt, worker.intake_limit_pages))


def run_retire_cleanup(ctx: Ctx, req, steps: Tuple[str, ...]) -> dict:
    """``Scheduler.retire_unadmitted_request`` (sch 21:3242, 22:3328, 23:3455):
    (1) conversation abort + clear the handle, (2) beam retire, (3) HiCache
    ``finish(ABORT)``, (4) ``update_finish_state``, (5) ``stream_output``."""
    out = {}
    if "session" in steps:
        out["session_slot"] = False
    if "hicache" in steps:
        out["cache_handle"] = False
    if "promote" in steps:
        out.update(promote(req))
    return out


# ================================================================ intake


def _room_free_for(c: Ctx, s: State, r: int) -> bool:
    """A request that reuses a ``bootstrap_room`` (``GenerateReqInput.bootstrap_room``
    is the client's to set) is sent once the room's previous user has its
    answer: from both workers, or from decode alone (``reuse_room_after``)."""
    prev = c.scenario.previous_user(r)
    if prev is None:
        return True
    both = c.scenario.reuse_room_after == "both"
    return s.d[prev].answer is not None and (not both or s.p[prev].answer is not None)


def _absent_p(c, s, r):
    return s.p[r].stage is PStage.ABSENT and _room_free_for(c, s, r)


@action("client", guard=_absent_p)
def p_intake(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Intake on prefill: ``handle_generate_request`` (sch 2586/2724/2749/2820/2943)
    validates the prompt against P's limit, then ``_add_request_to_queue``
    (sch 3018/3193/3266/3353/3480) dispatches it to the bootstrap door."""
    sc = c.scenario
    fields = validate_intake(sc.prefill, sc.prompt_pages[r])
    s = set_p(s, r, stage=PStage.DOOR, session_slot=sc.sessions,
              cache_handle=c.release.has_cache_handle,
              requeues_left=sc.optimistic_prefill_attempts, **fields)
    return s, ()


def _absent_d(c, s, r):
    return s.d[r].stage is DStage.ABSENT and _room_free_for(c, s, r)


@action("client", guard=_absent_d)
def d_intake(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Intake on decode: ``handle_generate_request`` (sch 2586/2724/2749/2820/2943)
    validates against D's own ``max_req_input_len`` (tp_worker.py 19:542-556),
    then ``_add_request_to_queue`` (sch 3018/3193/3266/3353/3480) dispatches to
    ``DecodePreallocQueue.add`` with ``is_retracted=False``."""
    sc = c.scenario
    fields = validate_intake(sc.decode, sc.prompt_pages[r])
    s = set_d(s, r, stage=DStage.DOOR, session_slot=sc.sessions,
              cache_handle=c.release.has_cache_handle, **fields)
    return s, ()


# ================================================================ prefill


def _at_p_door(c, s, r):
    return s.p[r].stage is PStage.DOOR


@action("prefill", guard=_at_p_door)
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
        evs = (Event("door_retire", r, "prefill", (reentering,)),)
        if "stream" in rel.retire_cleanup:
            s, ev2 = stream_p(s, r, (s.p[r].finished_reason or ABORT_400).status)
            evs += ev2
        return s, evs
    limit = (c.scenario.prefill.pool_pages if rel.sender_capacity == "pool"
             else c.scenario.prefill.intake_limit_pages)
    if req.origin_pages > limit:
        s = set_p(s, r, stage=PStage.GONE, finished_reason=ABORT_400)
        return stream_p(s, r, 400)
    s = set_p(s, r, stage=PStage.BOOTSTRAP, has_sender=True, pending_bootstrap=True)
    for q in pranks(c):  # one sender per prefill rank
        s = update_status(c, s, r, KVPoll.Bootstrapping, q)
    return s, (Event("acquire", r, "prefill", ("sender",)),)


def next_d_to_p(c: Ctx, s: State, r: int, rank: int = 0, q: int = 0) -> Optional[Msg]:
    """The oldest decode->prefill message of r's room from decode rank ``rank``
    to prefill rank ``q``, if request r sent it: ``send_metadata`` and
    ``receiver.abort`` share the cached socket to that bootstrap endpoint, so
    they arrive in order."""
    k = s.room_slot(r)
    for m in s.net:
        if m.kind in D_TO_P and m.rank == rank and m.prank == q and s.room_slot(m.rid) == k:
            return m if m.rid == r else None
    return None


def rank_of(arg: Tuple) -> int:
    """The decode rank a step names; a one-rank scenario leaves it out."""
    return arg[0] if arg else 0


def prank_of(arg: Tuple, i: int = 0) -> int:
    """The prefill rank a step names at position i; one prefill rank: left out."""
    return arg[i] if len(arg) > i else 0


def rank_args(c: Ctx, ranks: Iterable[int]) -> Tuple[Tuple, ...]:
    ranks = tuple(ranks)
    if c.scenario.decode.ranks == 1:
        return ((),) if 0 in ranks else ()
    return tuple((k,) for k in ranks)


def prank_args(c: Ctx, qs: Iterable[int]) -> Tuple[Tuple, ...]:
    qs = tuple(qs)
    if c.scenario.prefill.ranks == 1:
        return ((),) if 0 in qs else ()
    return tuple((q,) for q in qs)


def channel_args(c: Ctx, chans: Iterable[Tuple[int, int]]) -> Tuple[Tuple, ...]:
    """Step arguments naming (decode rank, prefill rank) pairs, trailing
    defaults left out: ``(k,)`` with several decode ranks, ``(0, q)`` with
    several prefill ranks, ``()`` with one of each."""
    chans = tuple(chans)
    if c.scenario.prefill.ranks > 1:
        return chans
    return rank_args(c, (k for k, _ in chans))


def channels(c: Ctx) -> Tuple[Tuple[int, int], ...]:
    """The (decode rank, prefill rank) pairs that talk: every pair (one side
    has a single rank), each a bootstrap connection of the receiver
    (``bootstrap_infos``)."""
    return tuple((k, q) for k in range(c.scenario.decode.ranks) for q in pranks(c))


def _d_to_p_channels(c: Ctx, s: State, r: int, kind: str) -> Tuple[Tuple[int, int], ...]:
    return tuple((k, q) for k, q in channels(c)
                 if (m := next_d_to_p(c, s, r, k, q)) is not None and m.kind == kind)


def _metadata_arrived(c, s, r):
    return bool(_d_to_p_channels(c, s, r, "metadata"))


def _metadata_channels(c, s, r):
    return channel_args(c, _d_to_p_channels(c, s, r, "metadata"))


@action("prefill", guard=_metadata_arrived, choices=_metadata_channels, arg_names=CHANNEL_ARG)
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
    if s.p[r].stage is not PStage.BOOTSTRAP:
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
    ``pending_bootstrap=False``, ``prepare_abort(500)``, stream."""
    s = failure_exception(c, s, r)
    s, evs = p_release_kv(s, r, unconditional=False)
    s = set_p(p_free_metadata(s, r), r, pending_bootstrap=False, finished_reason=ABORT_500,
              stage=PStage.GONE, cache_handle=False)
    s, ev2 = stream_p(s, r, 500)
    return s, evs + ev2


def finalize_bootstrap(c: Ctx, s: State, r: int) -> Effect:
    """``ensure_metadata_buffer`` + ``finalize_bootstrap`` (pf 363/377/394/406/429):
    ``start_send_idx = decode_prefix_len``; ``sender.init(ceil((len(origin) -
    prefix)/page), idx)``; ``pending_bootstrap=False``."""
    req = s.p[r]
    evs = () if req.holds_metadata else (Event("acquire", r, "prefill", ("metadata",)),)
    prefix = room_of(c, s, r).prefix
    s = set_p(s, r, holds_metadata=True, pending_bootstrap=False,
              send_pages=max(req.origin_pages - prefix, 0), sent=max(req.sent, prefix))
    return s, evs + (Event("acquire", r, "prefill", ("init",)),)


@action("prefill", guard=_bootstrap_ready)
def p_pop_bootstrapped(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P2 ``pop_bootstrapped`` (pf 410/425/450/462/497): Failed ->
    ``handle_bootstrap_failure``; WaitingForInput -> ``finalize_bootstrap`` and the
    waiting queue; Bootstrapping with optimistic prefill allowed and not
    ``is_retracted`` -> metadata buffer, waiting queue, still pending."""
    poll = sender_poll(c, s, r)
    if poll == KVPoll.Failed:
        return handle_bootstrap_failure(c, s, r)
    if poll == KVPoll.WaitingForInput:
        s, evs = finalize_bootstrap(c, s, r)
        return set_p(s, r, stage=PStage.WAITING), evs
    evs = () if s.p[r].holds_metadata else (Event("acquire", r, "prefill", ("metadata",)),)
    return set_p(s, r, stage=PStage.WAITING, holds_metadata=True), evs


def _waiting_resolvable(c, s, r):
    req = s.p[r]
    if req.stage is not PStage.WAITING or is_aborted(req):
        return False
    poll = sender_poll(c, s, r)
    return poll == KVPoll.Failed or (poll == KVPoll.WaitingForInput and req.pending_bootstrap)


@action("prefill", guard=_waiting_resolvable)
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


@action("prefill", guard=_can_forward)
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
    evs = (Event("acquire", r, "prefill", ("forward",)),)
    if not req.holds_kv:
        evs += (Event("acquire", r, "prefill", ("kv",)),)
    return s, evs


def _chunked_check(c, s, r):
    req = s.p[r]
    stages = (PStage.CHUNKED,) if _loop_timing(c) else (PStage.CHUNKED, PStage.FORWARDED)
    if req.stage not in stages or not req.pending_bootstrap or req.pending_chunked_abort:
        return False
    poll = sender_poll(c, s, r)
    if poll in (KVPoll.Failed, KVPoll.WaitingForInput):
        return True
    return (req.stage is PStage.CHUNKED and poll == KVPoll.Bootstrapping
            and (is_aborted(req) or _has_bootstrapped_waiting(s, r)))


@action("prefill", guard=_chunked_check)
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


@action("prefill", guard=_chunked_abort_pending)
def p_chunked_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``process_pending_chunked_abort`` (sch 3248/3459/3537/3650/3778):
    ``prepare_abort``, ``to_finish=None``, ``sender.abort()``, free metadata,
    ``pending_bootstrap=False``, ``release_kv_cache(is_insert=False)``,
    ``chunked_req=None``, abort sent to the tokenizer."""
    s = sender_abort(c, s, r)
    s, evs = p_release_kv(s, r, unconditional=True)
    s = set_p(p_free_metadata(s, r), r, finished_reason=c.abort_status, to_finish=None,
              pending_bootstrap=False, pending_chunked_abort=False, stage=PStage.GONE,
              cache_handle=False)
    s, ev2 = stream_p(s, r, c.abort_status.status)
    return s, evs + ev2


def takes_chunks(room: Room) -> bool:
    """The KV manager moves a chunk only for a room it knows, not Failed, with
    decode's destinations: when queuing it (``add_transfer_request``, mc
    19:2214-2240 ... 23:3081-3111) and again when the worker dequeues it
    (mc 19:1679-1680)."""
    return room.status not in (None, KVPoll.Failed) and room.dst is not None


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
            s = send(s, Msg("chunk", r, pages=(start - prefix, end - prefix), last=last, prank=q))
    return s, (Event("send", r, "prefill", (last, req.holds_metadata)),)


def optimistic_release_and_requeue(c: Ctx, s: State, r: int) -> Effect:
    """``optimistic_release_and_requeue`` (pf 1352/1471/1545/1673/1789): cache and
    release KV, ``reset_for_retract``, ``pending_bootstrap=True``; front of the
    waiting queue, or once attempts are exhausted straight into the bootstrap
    queue (no door; 0.5.23 frees the metadata buffer there)."""
    req = s.p[r]
    s, evs = p_release_kv(s, r, unconditional=True)
    fields = dict(is_retracted=True, results_due=(), extend_end=0, sent=0,
                  pending_bootstrap=True)
    if req.requeues_left > 0:
        fields.update(stage=PStage.WAITING, requeues_left=req.requeues_left - 1)
    else:
        fields.update(stage=PStage.BOOTSTRAP)
        if c.release.requeue_fallback_frees_metadata:
            fields.update(holds_metadata=False)
    s = set_p(s, r, **fields)
    return s, evs + (Event("requeue", r, "prefill", ()),)


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
    s, evs = p_release_kv(s, r, unconditional=False)
    return s, evs, True


def _loop_timing(c) -> bool:
    return c.scenario.result_timing == "loop"


def _result_due(c, s, r):
    req = s.p[r]
    if not req.results_due:
        return False
    # the overlap loop runs process_pending_chunked_abort (top of the step)
    # before it processes the last batch's result (pf 19:627-631)
    return not (_loop_timing(c) and req.pending_chunked_abort)


@action("prefill", guard=_result_due)
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
                s, ev2 = stream_p(s, r, s.p[r].finished_reason.status)
                evs += ev2
        elif decision == g.SEND and not req.pending_bootstrap:
            s, evs = send_kv_chunk(c, s, r, end)
        if req.stage is PStage.YIELDED and s.p[r].stage is PStage.YIELDED:
            s = set_p(s, r, stage=PStage.WAITING)  # yielded, nothing else to do: requeue
    else:  # ---------------------------------------------------------- final chunk
        if c.release.final_result(req):
            s, evs, retired = retire_aborted_prefill_result(c, s, r)
            if retired:
                s, ev2 = stream_p(s, r, s.p[r].finished_reason.status)
                evs += ev2
        else:
            # output token, maybe_cache_unfinished_req (pf 19:762): needs ownership
            evs = (Event("release", r, "prefill", ("cache", req.holds_kv or req.holds_mamba)),)
            s = set_p(s, r, stage=PStage.INFLIGHT)
            if not req.pending_bootstrap:
                s, ev2 = send_kv_chunk(c, s, r, end)
                evs += ev2
            evs += (Event("acquire", r, "prefill", ("inflight",)),)
    if was_gone:
        side = tuple(e for e in evs if e.kind in ("send", "acquire", "requeue", "release"))
        if side:
            evs += (Event("late_effect", r, "prefill", tuple(sorted({e.kind for e in side}))),)
    return s, evs


def _inflight_ready(c, s, r):
    req = s.p[r]
    if req.stage is not PStage.INFLIGHT:
        return False
    poll = sender_poll(c, s, r)
    if req.pending_bootstrap:
        return poll == KVPoll.Failed or poll == KVPoll.WaitingForInput
    return poll in (KVPoll.Success, KVPoll.Failed)


@action("prefill", guard=_inflight_ready)
def p_inflight(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """P6 ``process_disagg_prefill_inflight_queue`` (pf 876/947/1005/1108/1151).
    Parked (pending bootstrap): ``handle_pending_bootstrap`` then send.  Success:
    the ``inflight_success`` guard point sets ``finished_reason``,
    ``release_kv_cache`` (insert), ``sender.clear()``, stream, free metadata.
    Failed: ``handle_inflight_transfer_failure`` (pf 983/1057/1115/1239/1282)."""
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
        s, evs = p_release_kv(s, r, unconditional=True)
        s = sender_clear(c, s, r)
        s, ev2 = stream_p(s, r, reason.status)
        s = set_p(p_free_metadata(s, r), r, stage=PStage.GONE, cache_handle=False)
        return s, evs + ev2
    s = failure_exception(c, s, r)
    s, evs = p_release_kv(s, r, unconditional=True)
    if not (req.finished_reason is not None and req.finished_reason.is_abort):
        s = set_p(s, r, finished_reason=ABORT_500)
    s, ev2 = stream_p(s, r, s.p[r].finished_reason.status)
    s = set_p(p_free_metadata(s, r), r, stage=PStage.GONE, cache_handle=False)
    return s, evs + ev2


# ================================================================ transfer worker


def outstanding(c: Ctx, s: State, r: int, q: int = 0) -> bool:
    """``_staging_outstanding[room] > 0`` on prefill rank q.  The worker counts
    a chunk when it dequeues it, "so `outstanding == 0` means nothing is
    dequeued or in flight" (mc 19:1670-1676, 20:1863-1869, 21:2110-2116,
    22:2454-2460, 23:2519-2525): a chunk still in the queue does not count."""
    return room_of(c, s, r, q).outstanding > 0


def rank_msgs(s: State, kind: str, r: int, q: int) -> Tuple[Msg, ...]:
    """Messages of one kind on r's room from (or to) prefill rank q, oldest first."""
    return tuple(m for m in s.room_msgs(kind, r) if m.prank == q)


def own_ranks(s: State, kind: str, r: int) -> List[int]:
    """The prefill ranks with a message of one kind of request r's own in flight."""
    return sorted({m.prank for m in s.msgs(kind, r)})


def own_msg(s: State, kind: str, r: int, q: int) -> Msg:
    """Request r's oldest message of one kind from prefill rank q."""
    return next(m for m in s.msgs(kind, r) if m.prank == q)


def _worker_busy(s: State, r: int, q: int) -> bool:
    return bool(rank_msgs(s, "write", r, q))


def _queued_ranks(c, s, r):
    """Prefill ranks whose worker can take r's chunk: the oldest chunk of r's
    room on that rank is r's (the queue of a room is FIFO), and the worker is
    not busy with the room: one queue per destination session, one worker
    thread per queue, so a room's chunks are handled one at a time."""
    out = []
    for q in pranks(c):
        queue = rank_msgs(s, "chunk", r, q)
        if queue and queue[0].rid == r and not _worker_busy(s, r, q):
            out.append(q)
    return out


def _chunk_queued(c, s, r):
    return bool(_queued_ranks(c, s, r))


def _maybe_ack_drained(c: Ctx, s: State, r: int, q: int = 0) -> State:
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
    targets = {k: (gen, origin) for k, gen, origin in room.ack_to}
    if c.release.ack_targets == "fan-out":
        origin = room.ack_to[0][2]
        for k in room.peers:
            targets.setdefault(k, (0, origin))
    for k in sorted(targets):
        gen, origin = targets[k]
        s = send(s, Msg("ack", origin, rank=k, gen=gen, prank=q))
    return s


@action("transfer", guard=_chunk_queued, choices=lambda c, s, r: prank_args(c, _queued_ranks(c, s, r)),
        arg_names=PRANK_ARG)
def xfer_dequeue(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Mooncake ``transfer_worker`` (mc 1645/1838/2080/2423/2488) takes the room's
    oldest chunk and counts it outstanding (``outstanding``).  A Failed or
    unknown room is skipped: the count is popped and a drained abort acked
    (mc 19:1678-1693).  Otherwise the worker looks up decode's destinations
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
        return _maybe_ack_drained(c, s, r, q), (Event("xfer_skip", r, "transfer", ()),)
    s = set_room(c, s, r, q=q, outstanding=room.outstanding + 1)
    a, b = msg.pages
    checksum, covered = None, 0
    if msg.last:
        if c.release.checksum and c.scenario.prefill.kv_checksum:
            checksum = _p_digest(c, s, r, q)
        covered = room.prefix + max(s.p[r].send_pages, 0)
    return send(s, Msg("write", r, pages=room.dst[a:b], last=msg.last, slot=room.dst_slot,
                       checksum=checksum, covered=covered, prank=q)), ()


def _write_in_flight(c, s, r):
    return bool(s.msgs("write", r))


def land_write(s: State, r: int, pages: Tuple[int, ...], q: int) -> Effect:
    """Prefill rank q's part of r's KV lands in decode pages ``pages``,
    whatever they hold now."""
    new = list(s.d_pages)
    for pg in pages:
        new[pg] = new[pg].with_slice(q, r)
    return replace(s, d_pages=tuple(new)), (Event("write", r, "transfer", pages),)


@action("transfer", guard=_write_in_flight, choices=lambda c, s, r: prank_args(c, own_ranks(s, "write", r)),
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
        room = room_of(c, s, r, q)
        final = KVPoll.Success
        if c.release.conclude_transfer and (room.failure_record or room.status == KVPoll.Failed):
            final = KVPoll.Failed
        s = update_status(c, s, r, final, q)
        s = send(s, Msg("status", r, poll=final, prank=q))
    return worker_done(c, s, r, msg.last, q), evs


def worker_done(c: Ctx, s: State, r: int, last: bool, q: int = 0) -> State:
    """The end of prefill rank q's worker iteration on one of the room's
    chunks: the outstanding count drops (mc 19:1970, 20:2143, 21:2393,
    22:2773, 23:2845), a drained abort is acked, and a concluded room with
    nothing outstanding is torn down (mc 19:1980-1991, 20:2153-2164,
    21:2403-2414, 22:2783-2793, 23:2855-2865)."""
    s = set_room(c, s, r, q=q, outstanding=room_of(c, s, r, q).outstanding - 1)
    s = _maybe_ack_drained(c, s, r, q)
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
    start = room_of(c, s, r, q).prefix if c.release.checksum == "suffix" else 0
    return (r, start, min(req.extend_end, req.origin_pages) - start)


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
    """The prefill ranks where a transfer of request r's can fail now: its
    room is taking chunks for r, or, once the next request of the room has
    opened it, a write of r's is still in flight there. A scenario's
    ``transfer_failure`` names requests, and a failure is one of r's own
    transfers, so a shared room's later lifecycles do not fail under r's
    name."""
    ours = not _room_passed_on(c, s, r)
    out = []
    for q in pranks(c):
        room = room_of(c, s, r, q)
        if (room.status in (KVPoll.WaitingForInput, KVPoll.Transferring) and room.dst is not None
                and (ours or any(m.rid == r for m in rank_msgs(s, "write", r, q)))):
            out.append(q)
    return out


def _room_can_fail(c, s, r):
    return bool(_failing_ranks(c, s, r))


@action("transfer", guard=_room_can_fail, event="transfer_failure",
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
    poisons the room, which then never acks (mc 22:2677, 22:2698).  Without
    a write in flight it is a failure found before a send (a session already
    failed, the heartbeat), which poisons nothing.  Only prefill rank q's
    KV manager fails; the others go on."""
    q = prank_of(arg)
    inflight = rank_msgs(s, "write", r, q)
    if inflight:
        w = inflight[0]
        s = send(consume(s, w), Msg("stray", w.rid, pages=w.pages, prank=q))
    s = record_failure(c, s, r, q)
    if inflight and c.release.poison_failed_rooms:
        s = set_room(c, s, r, q=q, poisoned=True, ack_to=())
    s = send(s, Msg("status", r, poll=KVPoll.Failed, prank=q))
    if inflight:
        s = worker_done(c, s, r, inflight[0].last, q)
    return s, ()


def _stray_write(c, s, r):
    return bool(s.msgs("stray", r))


@action("transfer", guard=_stray_write,
        choices=lambda c, s, r: prank_args(c, own_ranks(s, "stray", r)), arg_names=PRANK_ARG)
def xfer_stray_lands(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """A write the worker gave up on (``xfer_fail``) lands in decode's pages:
    the RDMA engine finishes the batch whatever prefill has decided since
    (mc 22:2413-2421: "a failed send may still be writing decode's pages")."""
    q = prank_of(arg)
    msg = own_msg(s, "stray", r, q)
    return land_write(consume(s, msg), r, msg.pages, q)


def _abort_arrived(c, s, r):
    return bool(_d_to_p_channels(c, s, r, "abort"))


def _abort_channels(c, s, r):
    return channel_args(c, _d_to_p_channels(c, s, r, "abort"))


def register_ack_target(c: Ctx, s: State, msg: Msg) -> State:
    """``register_deferred_ack_target`` for the ABORT ``msg``: 0.5.19/0.5.20 keep
    one target per room, overwritten by a later ABORT (cc 19:441-447); 0.5.21
    also snapshots the room's ``transfer_infos`` peers (cc 21:729-739); 0.5.22+
    keep one target per decode endpoint with its generation, none for a
    poisoned room (cc 22:927-943).  Each target remembers (as history) the
    decode request whose ABORT registered it."""
    r, rank, gen, q = msg.rid, msg.rank, msg.gen, msg.prank
    room = room_of(c, s, r, q)
    if c.release.ack_targets == "last":
        return set_room(c, s, r, q=q, ack_to=((rank, gen, r),))
    if c.release.ack_targets == "fan-out":
        return set_room(c, s, r, q=q, ack_to=((rank, gen, r),) + tuple(
            (k, 0, r) for k in room.peers if k != rank))
    if room.poisoned:
        return s
    targets = {k: (k, g, o) for k, g, o in room.ack_to}
    targets[rank] = (rank, gen, r)
    return set_room(c, s, r, q=q, ack_to=tuple(sorted(targets.values())))


@action("prefill", guard=_abort_arrived, choices=_abort_channels, arg_names=CHANNEL_ARG)
def p_recv_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill rank q's bootstrap thread handles a decode rank's ABORT (mc 19:2022-2088,
    20:2195, 21:2449-2522, 22:2814-2849, 23:2886-2955).  An active room (present,
    not Success) becomes Failed.  Without deferral P replies with a 2-frame ack
    that decode never counts (mc 19:2173-2180), so nothing is modelled.  With
    deferral: 0.5.19/0.5.20 register the sender if the room is active, ack at
    once if it is inactive and drained, and do nothing otherwise; 0.5.21
    registers if active or outstanding; 0.5.22+ register every ABORT that
    carries a generation.  A registered target is acked once the room drains."""
    k, q = rank_of(arg), prank_of(arg, 1)
    msg = next_d_to_p(c, s, r, k, q)
    s = consume(s, msg)
    room = room_of(c, s, r, q)
    active = room.status is not None and room.status != KVPoll.Success
    busy = outstanding(c, s, r, q)
    if active:
        s = update_status(c, s, r, KVPoll.Failed, q)
    if not c.deferred:
        return s, ()
    if c.release.ack_targets == "per-endpoint":
        register = msg.gen != 0 or not c.release.ack_generations
    elif c.release.ack_targets == "fan-out":
        register = active or busy
    else:
        register = active
    if register:
        return _maybe_ack_drained(c, register_ack_target(c, s, msg), r, q), ()
    if c.release.ack_targets != "per-endpoint" and not busy:
        s = send(s, Msg("ack", r, rank=k, prank=q))
    return s, ()


# ================================================================ decode


def _at_d_door(c, s, r):
    return s.d[r].stage is DStage.DOOR


@action("decode", guard=_at_d_door)
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
        evs = (Event("door_retire", r, "decode", (reentering,)),)
        if "stream" in rel.retire_cleanup:
            s, ev2 = stream_d(s, r, (s.d[r].finished_reason or ABORT_400).status)
            evs += ev2
        return s, evs
    if req.origin_pages > c.scenario.decode.pool_pages:
        s = set_d(s, r, stage=DStage.GONE, finished_reason=ABORT_400, door_flag=None)
        return stream_d(s, r, 400)
    if is_retracted:
        return set_d(s, r, stage=DStage.RETRACTED, door_flag=None), ()
    s, polled = receiver_init(c, s, r)
    latched = polled if polled in (KVPoll.Failed, KVPoll.Success) else KVPoll.WaitingForInput
    s = set_d(s, r, stage=DStage.PREALLOC, has_receiver=True,
              receiver_state=latched, notified=(), held=())
    return s, (Event("acquire", r, "decode", ("receiver",)),)


def _prealloc_drop(c, s, r):
    req = s.d[r]
    return req.stage is DStage.PREALLOC and (
        c.release.prealloc_scan(req) or receiver_poll(c, s, r) == KVPoll.Failed)


@action("decode", guard=_prealloc_drop)
def d_prealloc_drop(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D2 ``pop_preallocated`` first loop (dc 1141/1157/1293/1365/1395): an entry
    the ``prealloc_scan`` guard point drops, or whose receiver polled Failed
    (``prepare_abort``), is streamed and its receiver cleared."""
    req = s.d[r]
    reason = req.finished_reason if (req.finished_reason and req.finished_reason.is_abort) else ABORT_500
    s = set_d(receiver_clear(c, s, r), r, stage=DStage.GONE, finished_reason=reason,
              has_receiver=False, cache_handle=False, session_slot=False)
    return stream_d(s, r, reason.status)


def page_choices(s: State, need: int) -> Iterable[Tuple[int, ...]]:
    """Every way to take ``need`` free pages, one representative per ordered
    sequence of page *signatures*: free pages with the same last writer that
    no stale destination or in-flight metadata names are indistinguishable."""
    free = s.free_d_pages()
    if len(free) < need:
        return ()
    refs: Dict[int, list] = {p: [] for p in free}
    for r, room in enumerate(s.rooms):
        for i, p in enumerate(room.dst or ()):
            if p in refs:
                refs[p].append(("dst", r, i))
    for m in s.net:
        if m.kind == "metadata":
            for i, p in enumerate(m.pages):
                if p in refs:
                    refs[p].append(("msg", m.rid, i))
    classes: Dict[Tuple, List[int]] = {}
    for p in free:
        classes.setdefault((tuple((w is None, w or 0) for w in s.d_pages[p].writers),
                            tuple(refs[p])), []).append(p)
    keys = sorted(classes)

    def build(prefix: Tuple[int, ...], used: Dict[Tuple, int]):
        if len(prefix) == need:
            yield prefix
            return
        for k in keys:
            i = used.get(k, 0)
            if i < len(classes[k]):
                used[k] = i + 1
                yield from build(prefix + (classes[k][i],), used)
                used[k] = i
    # lazy: the count grows factorially with distinct page classes, and the
    # Hypothesis engine samples from a bounded prefix of it
    return build((), {})


def slot_choices(s: State) -> Tuple[int, ...]:
    """One free metadata slot per class of indistinguishable ones.  Decode's
    allocator hands out slots in the order they were freed (a deque,
    ``ReqToMetadataIdxAllocator`` ut 19:270-290) and nothing resets a slot at
    allocation, so a slot a late aux write dirtied after its free is handed
    out as it is; the model lets any free slot come next."""
    free = [i for i, sl in enumerate(s.d_slots) if sl.owner is None]
    refs: Dict[int, list] = {i: [] for i in free}
    for r, room in enumerate(s.rooms):
        if room.dst_slot in refs:
            refs[room.dst_slot].append(("dst", r))
    for m in s.net:
        if m.kind == "metadata" and m.slot in refs:
            refs[m.slot].append(("msg", m.rid, m.rank))
    seen: Dict[Tuple, int] = {}
    for i in free:
        sl = s.d_slots[i]
        seen.setdefault((repr((sl.room, sl.checksum, sl.covered_pages)), tuple(refs[i])), i)
    return tuple(sorted(seen.values()))


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


def _can_prealloc(c, s, r):
    req = s.d[r]
    return (req.stage is DStage.PREALLOC and not _prealloc_drop(c, s, r)
            and receiver_poll(c, s, r) == KVPoll.WaitingForInput and bool(slot_choices(s))
            and len(s.free_d_pages()) >= _prealloc_need(c, req, 1 if _radix_hit_possible(c, req)
                                                        else 0))


def _radix_hit_possible(c: Ctx, req: DecodeReq) -> bool:
    """A decode prefix hit needs the decode radix cache, which a rebootstrap
    never uses (dc 21:1400-1403)."""
    return c.scenario.decode.radix_cache and req.origin_pages >= 2 and not req.rebootstrap


@action("decode", guard=_can_prealloc, choices=_prealloc_choices,
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
    pages = list(s.d_pages)
    for pg in chosen:
        pages[pg] = replace(pages[pg], owner=r)
    slots = list(s.d_slots)
    slots[slot] = replace(slots[slot], owner=r)
    s = replace(s, d_pages=tuple(pages), d_slots=tuple(slots))
    s = set_d(s, r, stage=DStage.TRANSFER, pages=tuple(chosen), prefix_pages=prefix,
              meta_slot=slot)
    for k, q in channels(c):  # to every prefill rank the receiver bootstraps from
        s = send(s, Msg("metadata", r, pages=tuple(chosen), slot=slot, checksum=(prefix,),
                        rank=k, prank=q))
    if req.rebootstrap:  # submit_prefill_recompute (dc 21:1748-1752)
        s = send(s, Msg("recompute", r))
    return s, (Event("prealloc", r, "decode", (is_aborted(req),)),
               Event("acquire", r, "decode", ("kv",)))


def clear_checksum(c: Ctx, slot: MetaSlot) -> Optional[Tuple]:
    """The checksum row a freed metadata slot keeps: 0.5.21/0.5.22 leave the last
    owner's (only ``bootstrap_room[idx] = 0``), 0.5.23's ``clear_slot`` zeroes it
    (ut 23:517-522)."""
    return None if c.release.clear_slot_resets_checksum else slot.checksum


def d_release(c: Ctx, s: State, r: int) -> State:
    """Free the request's D pages and metadata slot (``release_kv_cache`` on D and
    the slot reset; ``_do_release`` dc 2390/2477/2791/2909/3018 for held ones).
    The reset zeroes ``bootstrap_room[idx]`` and, from 0.5.23, the checksum row
    (``clear_slot``, dc 23:2987/3024)."""
    req = s.d[r]
    pages = list(s.d_pages)
    for pg in req.pages:
        pages[pg] = replace(pages[pg], owner=None)
    slots = list(s.d_slots)
    if req.meta_slot >= 0:
        slot = slots[req.meta_slot]
        slots[req.meta_slot] = replace(slot, owner=None, room=0, checksum=clear_checksum(c, slot))
    s = replace(s, d_pages=tuple(pages), d_slots=tuple(slots))
    if req.has_receiver:
        s = receiver_clear(c, s, r)
    return set_d(s, r, pages=(), meta_slot=-1, has_receiver=False)


def _transferred_ready(c, s, r):
    req = s.d[r]
    polled = receiver_poll(c, s, r)
    return req.stage is DStage.TRANSFER and polled is not None and (
        bool(s.room_msgs("status", r)) or polled == KVPoll.Failed)


def _report_choices(c, s, r):
    """Prefill ranks with a status report on r's room in flight: reports of
    different ranks arrive in any order."""
    ranks = sorted({m.prank for m in s.room_msgs("status", r)})
    return prank_args(c, ranks) if ranks else ((),)


@action("decode", guard=_transferred_ready, choices=_report_choices, arg_names=PRANK_ARG)
def d_transferred(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D3 ``pop_transferred`` (dc 2245/2331/2616/2728/2833).  Success: the
    ``commit_check`` guard point on the slot's room (``_commit_transfer_to_req``),
    then the waiting queue and the slot freed.  Failed: ``prepare_abort(500)``,
    stream, then release now or hold until the drain ack (§5.5)."""
    req = s.d[r]
    status = rank_msgs(s, "status", r, prank_of(arg))
    if status:
        # decode's KV manager thread applies the report to request_status[room]
        # (mc 19:2188-2206, cc 20:569-614 ... 23:930-975): a Success counts in
        # the room's prefill_response_tracker if the room is tracked, and sets
        # Success once every prefill rank is in it; Failed never re-creates one
        s = consume(s, status[0])
        if status[0].poll == KVPoll.Success:
            t = d_room_of(c, s, r)
            if t.status is not None:
                q = status[0].prank
                responded = tuple(sorted({x for x in t.responded if x[0] != q}
                                         | {(q, status[0].rid)}))
                s = set_d_room(c, s, r, responded=responded)
                if len(responded) >= c.scenario.prefill.ranks:
                    s = set_d_room(c, s, r, status=c.release.update_status(t.status, KVPoll.Success))
        else:
            s = receiver_fail(c, s, r)
    poll = receiver_poll(c, s, r)
    if poll is not None and poll not in (KVPoll.Success, KVPoll.Failed):
        return s, ()  # not every prefill rank has reported yet
    if poll == KVPoll.Success:
        counted = d_room_of(c, s, r).responded
        slot = s.d_slots[req.meta_slot]
        refused = c.release.commit_check(req, slot, room_id(c, r))
        if refused is None:
            expected = slot.checksum if (c.release.checksum and c.scenario.decode.kv_checksum) else None
            if c.release.checksum == "suffix" and not c.scenario.layouts_match:
                expected = None  # 0.5.23 skips on a layout-signature mismatch
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
            return s, (Event("commit", r, "decode",
                             (room_id(c, r), counted, c.scenario.prefill.ranks)),)
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=refused,
                  cache_handle=False, session_slot=False)
        return stream_d(s, r, refused.status)
    s = set_d(receiver_fail(c, s, r), r, finished_reason=ABORT_500, receiver_state=KVPoll.Failed)
    s, evs = stream_d(s, r, 500)
    holders: Tuple[int, ...] = ()
    if c.deferred:
        if c.release.hold_unnotified:  # ensure_abort_notified(force_arm=True) (dc 21:2692)
            s = notify_abort(c, s, r, _all_ranks(c), arm=True)
            holders = _all_ranks(c)
        else:  # 0.5.19/0.5.20: only a rank that notified P holds (dc 19:2305-2318)
            holders = s.d[r].notified
    if not holders:
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, cache_handle=False, session_slot=False)
        return s, evs
    if len(holders) < c.scenario.decode.ranks:  # the other ranks release now
        evs += (Event("rank_release", r, "decode", tuple(k for k in _all_ranks(c) if k not in holders)),)
    s = set_d(s, r, stage=DStage.HELD, held=holders)
    s, ev2 = resolve_held(c, s, r)
    return s, evs + ev2


def _late_status(c, s, r):
    sc = c.scenario
    if not sc.shares_rooms or not s.msgs("status", r):
        return False
    users = sc.room_users(r)
    if any(s.d[u].has_receiver for u in users):
        return False
    # only a later user of the room could still take it: elsewhere the message
    # is inert, and leaving it in flight merges states (notes/design.md)
    return any(s.d[u].stage in (DStage.ABSENT, DStage.DOOR) for u in users)


@action("decode", guard=_late_status,
        choices=lambda c, s, r: prank_args(c, own_ranks(s, "status", r)),
        arg_names=PRANK_ARG)
def d_drop_late_status(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Decode's KV manager drops a prefill status for a room it no longer
    tracks (``apply_prefill_status``: "Dropping late status for cleared room",
    cc 20:578-583, 23:930-935; 0.5.19 checks ``request_status`` before counting
    a Success and never resurrects a room with Failed, mc 19:2188-2206,
    cc 19:365-373).  Once a later request of the room has its receiver, the
    same message counts as that request's."""
    q = prank_of(arg)
    return consume(s, own_msg(s, "status", r, q)), (Event("status_dropped", r, "decode", ()),)


def _status_popped(c, s, r):
    req = s.d[r]
    return (req.stage in (DStage.PREALLOC, DStage.TRANSFER) and req.has_receiver
            and receiver_poll(c, s, r) is None)


@action("decode", guard=_status_popped)
def d_poll_popped_room(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """A receiver polls a room whose ``request_status`` entry another request
    of the room has popped (its ``clear()``): ``check_status`` is
    ``request_status[room]`` (cc 19:362-363 ... 23:608-609) and raises
    KeyError, which neither ``pop_preallocated`` nor ``pop_transferred``
    catches (``poll_and_all_reduce``, utils 19:205-212): the decode
    scheduler's loop dies.  The model records the crash and fails the
    request so the search can go on; ``no-poll-of-popped-room`` flags it."""
    s = set_d(s, r, receiver_state=KVPoll.Failed)
    return s, (Event("poll_keyerror", r, "decode", ()),)


def _d_digest(c: Ctx, s: State, r: int) -> Tuple:
    """D's digest over its own range (§5.8): the checksum matches P's only when
    every page of the range holds this request's KV and the lengths agree."""
    req = s.d[r]
    start = req.prefix_pages if c.release.checksum == "suffix" else 0
    length = req.origin_pages - start
    own = all(s.d_pages[p].written_by(r) for p in req.pages[max(start - req.prefix_pages, 0):])
    return (r, start, length) if own else ("mismatch",)


def _prebuilt_ready(c, s, r):
    return s.d[r].stage is DStage.WAITING


@action("decode", guard=_prebuilt_ready)
def d_attend(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D4 ``get_new_prebuilt_batch`` (dc 2592/2679/3023/3168/3273): 0.5.21+
    ``_verify_kv_checksums`` first when D expects a digest, then the decode
    forward attends over every page of the reserved range."""
    req = s.d[r]
    if req.expected_checksum is not None and _d_digest(c, s, r) != req.expected_checksum:
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=ABORT_500,
                  cache_handle=False, session_slot=False)
        return stream_d(s, r, 500)
    foreign = tuple(p for p in req.pages if s.d_pages[p].foreign_to(r))
    s = set_d(s, r, stage=DStage.RUNNING, expected_checksum=None,
              read_foreign=req.read_foreign or bool(foreign))
    return s, (Event("read", r, "decode", (bool(foreign), foreign)),)


def _running(c, s, r):
    return s.d[r].stage is DStage.RUNNING


@action("decode", guard=_running)
def d_respond(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """The decode step's ``update_finish_state`` (sb 1721/1843/1919/1913/2007)
    promotes a pending ``to_finish`` or finishes by length; the response is
    streamed and the request's pages and handle released."""
    req = s.d[r]
    reason = req.to_finish if req.to_finish is not None else (req.finished_reason or LENGTH)
    s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=reason, to_finish=None,
              cache_handle=False, session_slot=False)
    return stream_d(s, r, reason.status, own=None if reason.is_abort else not req.read_foreign)


def _retractable(c, s, r):
    return s.d[r].stage is DStage.RUNNING and not s.d[r].was_retracted


@action("decode", guard=_retractable, event="retract")
def d_retract(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """R1 memory retract: ``retract_decode`` (sb 3030/3168/3297/3298/3451) ->
    ``release_req`` (sb 2036/2163/2239/2242/2360: host backup, release KV,
    ``reset_for_retract``) -> ``_add_request_to_queue(is_retracted=True)``
    (sch 3939/4171/4264/4416/4540)."""
    s = d_release(c, s, r)
    s = set_d(s, r, stage=DStage.DOOR, door_flag="retracted", is_retracted=True,
              retraction_backup=True, was_retracted=True)
    return s, (Event("release", r, "decode", ("kv", True)),)


def _resumable(c, s, r):
    req = s.d[r]
    return req.stage is DStage.RETRACTED and len(s.free_d_pages()) >= req.origin_pages


def _resume_choices(c, s, r):
    return ((0, pages) for pages in page_choices(s, s.d[r].origin_pages))


@action("decode", guard=_resumable, choices=_resume_choices, event="retract",
        arg_names=("prefix", "pages"))
def d_resume(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """R5 ``resume_retracted_reqs`` (dc 804/829/950/997/1021): fresh ``_pre_alloc``,
    the host backup restored into the new pages, ``is_retracted=False``, then
    the waiting queue (no door)."""
    _, chosen = arg
    pages = list(s.d_pages)
    for pg in chosen:
        pages[pg] = replace(pages[pg], owner=r).all_written_by(r)
    s = replace(s, d_pages=tuple(pages))
    s = set_d(s, r, stage=DStage.WAITING, pages=tuple(chosen), prefix_pages=0,
              retraction_backup=False, is_retracted=False)
    return s, (Event("acquire", r, "decode", ("kv",)),)


def _pausable(c, s, r):
    return s.d[r].stage is DStage.RUNNING and not s.d[r].was_retracted


@action("decode", guard=_pausable, event="preempt")
def d_pause_retract(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """R2 ``pause_generation(mode="retract")`` (sch 5180/5437/5655/5690/5908):
    ``retract_all(offload_kv=False)`` frees the KV without a host backup and
    ``reset_for_retract`` sets ``is_retracted``; ``hold_rebootstrap`` then, on
    resume, ``enqueue_held_rebootstrap`` -> ``add(is_rebootstrap=True)``
    (dc 19:712-730, 21:848-867).  Neither checks a pending ``to_finish``."""
    s = d_release(c, s, r)
    s = set_d(s, r, stage=DStage.DOOR, door_flag="rebootstrap", is_retracted=True,
              rebootstrap=True, was_retracted=True, read_foreign=False)
    return s, (Event("release", r, "decode", ("kv", True)),)


def _recompute_requested(c, s, r):
    return bool(s.msgs("recompute", r)) and s.p[r].stage is PStage.GONE and not s.p[r].results_due


@action("prefill", guard=_recompute_requested)
def p_recompute(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill receives decode's ``submit_prefill_recompute`` payload
    (``build_rebootstrap_payload``, dc 21:1748-1752): a new prefill ``Req`` for
    the same room, validated at P's intake like any request and dispatched to
    the bootstrap door (sch 2586/2724/2749/2820/2943)."""
    s = consume(s, s.msgs("recompute", r)[0])
    sc = c.scenario
    old = s.p[r]
    fields = validate_intake(sc.prefill, s.d[r].origin_pages)
    fresh = PrefillReq(stage=PStage.DOOR, session_slot=sc.sessions,
                       cache_handle=c.release.has_cache_handle,
                       requeues_left=sc.optimistic_prefill_attempts, answer=old.answer,
                       **{**fields, "rejected": old.rejected or fields.get("rejected", False)})
    return replace(s, p=s.p[:r] + (fresh,) + s.p[r + 1:]), ()


def _all_ranks(c: Ctx) -> Tuple[int, ...]:
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
            s = send(s, Msg("abort", r, rank=k, gen=gen, prank=q))
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


def resolve_held(c: Ctx, s: State, r: int, tracker: Optional[DRoom] = None) -> Effect:
    """``resolve_deferred_releases`` (dc 19:2405-2436 ... 23:3046-3090): a rank
    whose tracker for the room has an ack from every prefill rank it
    bootstrapped from releases its hold (``is_abort_release_safe(room,
    required_acks)``, ``required_acks = len(bootstrap_infos)``, dc
    19:2416, 22:2894-2898; the tracker is the room's, whoever armed it).  Up
    to 0.5.22 each rank decides alone; 0.5.23 MIN-reduces readiness, so the
    ranks release together.  The pool is one picture of every rank's pool in
    lockstep: its pages free when the last rank lets go (the ranks in
    between have diverged)."""
    req = s.d[r]
    if req.stage is not DStage.HELD:
        return s, ()
    if tracker is None:
        tracker = d_room_of(c, s, r)
    required = c.scenario.prefill.ranks
    ready = tuple(k for k in req.held if len(tracker.acked_by(k)) >= required)
    if not ready or (c.release.release_reduced and len(ready) < len(req.held)):
        return s, ()
    # history: whose ABORT the acks that free this hold answered
    evs = (Event("ack_release", r, "decode",
                 tuple(sorted({o for k, _, o in tracker.acked if k in ready}))),)
    held = tuple(k for k in req.held if k not in ready)
    if held:
        return set_d(s, r, held=held), evs + (Event("rank_release", r, "decode", ready),)
    s, ev2 = do_release(c, s, r, on_ack=True)
    return s, evs + ev2


def do_release(c: Ctx, s: State, r: int, on_ack: bool) -> Effect:
    """``_do_release`` (dc 2390/2477/2791/2909/3018): the held pages and slot are
    freed on every rank still holding, and ``clear_deferred_abort_state(room)``
    pops the room's drain-ack tracker, whoever armed it."""
    s = set_d(d_release(c, s, r), r, stage=DStage.GONE, held=(),
              released_on_ack=on_ack, cache_handle=False, session_slot=False)
    s = set_d_room(c, s, r, armed=(), acked=())
    return s, (Event("release", r, "decode", ("kv", True)),)


# ================================================================ client aborts


def _p_abortable(c, s, r):
    req = s.p[r]
    if s.aborted_by_client[r]:
        return False
    if req.stage is PStage.YIELDED:
        # a yield (process_prefill_chunk) and the request's middle result are
        # handled in the same loop iteration; aborts are read only at its top
        return not _loop_timing(c)
    return req.stage in (PStage.BOOTSTRAP, PStage.WAITING, PStage.CHUNKED,
                         PStage.FORWARDED, PStage.INFLIGHT)


@action("client", guard=_p_abortable, event="client_abort")
def p_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``abort_request`` on P (§5.7; sch 4984/5235/5465/5476/5693 ...): method 1
    pops a waiting request; bootstrap and inflight queues abort the sender
    (``handle_*_failure`` follows at the next poll); a chunked request is marked
    for ``process_pending_chunked_abort``; method 3 sets ``to_finish`` on
    requests in the last batch."""
    req = s.p[r]
    s = replace(s, aborted_by_client=s.aborted_by_client[:r] + (True,) + s.aborted_by_client[r + 1:])
    evs: Tuple[Event, ...] = ()
    if req.stage is PStage.WAITING:  # method 1
        if c.release.p_waiting_abort_releases_all or req.pending_bootstrap:
            s = sender_abort(c, s, r)
        if c.release.p_waiting_abort_releases_all:
            s, evs = p_release_kv(s, r, unconditional=False)
        s = set_p(p_free_metadata(s, r), r, stage=PStage.GONE, finished_reason=c.abort_status,
                  pending_bootstrap=False if c.release.p_waiting_abort_releases_all
                  else req.pending_bootstrap, cache_handle=False)
        s, ev2 = stream_p(s, r, c.abort_status.status)
        return s, evs + ev2
    if req.stage in (PStage.BOOTSTRAP, PStage.INFLIGHT):
        return sender_abort(c, s, r), ()
    if req.stage is PStage.CHUNKED:
        s = set_p(s, r, pending_chunked_abort=True)
    if req.results_due and not g.finished(s.p[r]):  # method 3: in last_batch
        s = set_p(s, r, to_finish=c.abort_status)
    return s, ()


def _d_abortable(c, s, r):
    req = s.d[r]
    return not req.client_aborted and req.stage in (
        DStage.PREALLOC, DStage.TRANSFER, DStage.WAITING, DStage.RUNNING, DStage.RETRACTED)


@action("client", guard=_d_abortable, event="client_abort")
def d_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``abort_request`` on D (§5.7): prealloc and transfer queues call
    ``receiver.abort()`` (cc 1626/1857/2016/2552/2955: Failed, ABORT sent to P);
    the waiting queue is method 1 (release KV); a running request gets method 3
    (``to_finish``); the retracted queue discards the host backup."""
    req = s.d[r]
    s = set_d(s, r, client_aborted=True)
    if req.stage in (DStage.PREALLOC, DStage.TRANSFER):
        s = set_d(receiver_fail(c, s, r), r, receiver_state=KVPoll.Failed)
        published = req.stage is DStage.TRANSFER  # init_time set: metadata sent
        if c.release.arm_before_send:
            return notify_abort(c, s, r, _all_ranks(c), arm=published), ()
        s = notify_abort(c, s, r, _all_ranks(c), arm=False)
        if published and c.deferred:  # sch 19:5067-5085: arm after send, a fresh set
            for k in s.d[r].notified:
                s = arm_tracker(c, s, r, k, 0)
        return s, ()
    if req.stage is DStage.WAITING:
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=c.abort_status,
                  cache_handle=False, session_slot=False)
        return stream_d(s, r, c.abort_status.status)
    if req.stage is DStage.RETRACTED:
        s = set_d(s, r, stage=DStage.GONE, retraction_backup=False,
                  finished_reason=c.abort_status, cache_handle=False, session_slot=False)
        return stream_d(s, r, c.abort_status.status)
    return set_d(s, r, to_finish=c.abort_status), ()


# ================================================================ timeouts and acks


def _bootstrapping_ranks(c, s, r):
    return [q for q in pranks(c) if room_of(c, s, r, q).status == KVPoll.Bootstrapping]


def _bootstrapping_sender(c, s, r):
    req = s.p[r]
    return (req.has_sender and req.stage is not PStage.GONE
            and bool(_bootstrapping_ranks(c, s, r)) and req.concluded is None)


@action("prefill", guard=_bootstrapping_sender, event="timeouts")
def p_bootstrap_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s, env 19:656): a sender
    still Bootstrapping records a failure and goes Failed.  Every prefill
    rank's sender started its clock in the same scheduler step, so the ranks
    still bootstrapping time out together."""
    for q in _bootstrapping_ranks(c, s, r):
        s = record_failure(c, s, r, q)
    return s, ()


def _d_waiting_too_long(c, s, r):
    req = s.d[r]
    return (req.stage is DStage.TRANSFER and receiver_poll(c, s, r) == KVPoll.WaitingForInput
            and not s.room_msgs("status", r))


def _waiting_timeout_ranks(c, s, r):
    return rank_args(c, _all_ranks(c))


@action("decode", guard=_d_waiting_too_long, choices=_waiting_timeout_ranks, event="timeouts",
        arg_names=RANK_ARG)
def d_waiting_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``_check_waiting_timeout`` (cc 1595/1823/1982/2501/2888, 300 s) on one
    decode rank: record a failure, go Failed, send that rank's ABORT to P, set
    ``abort_notified``.  0.5.19/0.5.20 never arm the drain-ack tracker here
    (cc 19:1605-1619); 0.5.21+ arm it first (cc 21:2046-2049).  The poll is
    MIN-reduced over ranks, so the request fails on every rank."""
    s = set_d(receiver_fail(c, s, r), r, receiver_state=KVPoll.Failed)
    return notify_abort(c, s, r, (rank_of(arg),), arm=c.release.arm_before_send), ()


def _ack_arrived(c, s, r):
    return bool(s.msgs("ack", r))


def _ack_channels(c, s, r):
    return channel_args(c, sorted({(m.rank, m.prank) for m in s.msgs("ack", r)}))


@action("decode", guard=_ack_arrived, choices=_ack_channels, arg_names=CHANNEL_ARG)
def d_recv_ack(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """An ABORT_ACK answering request r's ABORT reaches one decode rank
    (``note_abort_ack(room)``, cc 19:391-396; 0.5.22+ ``handle_abort_ack_message``,
    cc 22:853-876): counted by the room's tracker on that rank if it is armed
    and, from 0.5.22, for the generation it armed; every held request of the
    room then re-checks (``resolve_deferred_releases`` -> ``_do_release``)."""
    k, q = rank_of(arg), prank_of(arg, 1)
    msg = next(m for m in s.msgs("ack", r) if m.rank == k and m.prank == q)
    s = consume(s, msg)
    t = d_room_of(c, s, r)
    armed = {rank: gen for rank, gen, _ in t.armed}
    counted = k in armed and (not c.release.ack_generations
                              or (msg.gen != 0 and armed[k] == msg.gen))
    if not counted:
        return s, (Event("ack_dropped", r, "decode", (k,)),)
    if q not in t.acked_by(k):  # the tracker is a set of prefill ranks
        s = set_d_room(c, s, r, acked=tuple(sorted(t.acked + ((k, q, r),))))
    # every held entry is judged on the tracker as it is now, before any of
    # them is released (a release pops the room's tracker), dc 19:2413-2423
    tracker = d_room_of(c, s, r)
    evs: Tuple[Event, ...] = ()
    for u in c.scenario.room_users(r):
        s, ev = resolve_held(c, s, u, tracker)
        evs += ev
    return s, evs


def _held(c, s, r):
    return s.d[r].stage is DStage.HELD


@action("decode", guard=_held, event="timeouts")
def d_deferred_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`` (30 s): a held
    device entry is released anyway ("releasing anyway", dc 19:2405-2436).  The
    ranks set their deadlines in the same iteration, so they pass together."""
    return do_release(c, s, r, on_ack=False)


# ================================================================ the model


def initial_state(sc: Scenario) -> State:
    n = sc.n
    return State(
        p=tuple(PrefillReq() for _ in range(n)),
        d=tuple(DecodeReq() for _ in range(n)),
        # keyed by (room slot, prefill rank)
        rooms=tuple(Room() for _ in range(n * sc.prefill.ranks)),
        d_rooms=tuple(DRoom() for _ in range(n)),
        room_slots=tuple(sc.room_slot(r) for r in range(n)) if sc.shares_rooms else (),
        d_pages=tuple(Page(slice_writers=(None,) * (sc.prefill.ranks - 1))
                      for _ in range(sc.decode.pool_pages)),
        d_slots=tuple(MetaSlot() for _ in range(sc.decode.metadata_buffers)),
        aborted_by_client=tuple(False for _ in range(n)),
    )


@attrs.frozen(order=True)
class Step:
    """A transition label: action name, request, choice."""

    action: str
    rid: int
    arg: Tuple = ()

    def __str__(self) -> str:
        a = BY_NAME.get(self.action)
        names = a.arg_names if a is not None else ()
        parts = [f"r{self.rid}"]
        for i, v in enumerate(self.arg):
            name = names[i] if i < len(names) else f"arg{i}"
            parts.append(f"{name}={list(v) if isinstance(v, tuple) else v}")
        return f"{self.action}({', '.join(parts)})"


def successors(ctx: Ctx, s: State, max_choices: Optional[int] = None
               ) -> Iterable[Tuple[Step, State, Tuple[Event, ...]]]:
    """Every enabled step of ``s``: the next-state relation is the disjunction
    of the actions, over requests and choices (with ``max_choices``, only the
    first that many choices of each action: a bounded sample)."""
    for a in ACTIONS:
        for r in range(ctx.scenario.n):
            if not a.enabled(ctx, s, r):
                continue
            for arg in itertools.islice(a.args(ctx, s, r), max_choices):
                nxt, evs = a.effect(ctx, s, r, arg)
                yield Step(a.name, r, arg), nxt, evs


def apply(ctx: Ctx, s: State, step: Step) -> Optional[Tuple[State, Tuple[Event, ...]]]:
    """Re-execute one recorded step, or None when its guard is not enabled."""
    a = BY_NAME.get(step.action)
    if a is None or not 0 <= step.rid < ctx.scenario.n or not a.enabled(ctx, s, step.rid):
        return None
    if a.choices is not None and tuple(step.arg) not in {tuple(x) for x in a.args(ctx, s, step.rid)}:
        return None
    return a.effect(ctx, s, step.rid, tuple(step.arg))
