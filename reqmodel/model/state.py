"""The state of a PD-disaggregated SGLang deployment, as frozen attrs values.

Every value here is immutable and hashable: the exhaustive checker stores
states in a visited set, and symmetry reduction (``reqmodel.symmetry``)
relabels request and page identities on these values without touching the
protocol.

Lengths are in *pages*.  A prompt of ``n`` pages is ``n * page_size`` tokens;
the intake stub that ``Req.set_finish_with_abort`` leaves behind
(``origin_input_ids = array('q', [0])``, sb 19:1927) is one token, hence one
page.  Request ``i`` uses ``bootstrap_room = i + 1`` (room 0 means "metadata
not ready", dc 19:2059-2090).

Field names follow SGLang's ``Req`` where a guard point reads them, so that
guard proposals (issue #6) can be written with the names a contributor knows.
"""
from __future__ import annotations

import enum
from typing import Optional, Tuple

import attrs


class KVPoll(enum.IntEnum):
    """``KVPoll`` ordering, bc 19:93-98: Failed < Bootstrapping < ... < Success."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# A field marked ITF_OMIT is left out of a trace file while it has its default
# value: it only matters in some scenarios (several prefill ranks, a client
# abort), and other traces keep the shape they had before it was modelled.
ITF_OMIT = {"itf_omit_default": True}


@attrs.frozen(order=True)
class Finish:
    """A finish reason: ``FINISH_ABORT(message, status)`` or ``FINISH_LENGTH(0)``.

    ``why`` is the kind of message the code builds where it is not the
    status alone: ``"client"`` for the verdict of the client's abort
    (``abort_request``'s ``FINISH_ABORT()``, the waiting timeout's message),
    whose status on 0.5.19 (500) equals a failure's.  Empty for the others:
    an intake rejection (400), a failure (``prepare_abort``, 500), a length
    finish (200).  Left out of a trace file while empty."""

    kind: str  # "abort" | "length"
    status: int  # HTTP status the client sees for this reason
    why: str = attrs.field(default="", metadata=ITF_OMIT)

    @property
    def is_abort(self) -> bool:
        return self.kind == "abort"

    @property
    def cause(self) -> str:
        """What this reason tells the client ended the request: ``client``
        (its own abort), ``reject`` (intake), ``failure`` (a transfer,
        bootstrap or timeout failure), ``done`` (completion)."""
        if not self.is_abort:
            return "done"
        if self.why:
            return self.why
        return "reject" if self.status == 400 else "failure"

    def __str__(self) -> str:
        if not self.is_abort:
            return "FINISH_LENGTH(0)"
        whose = ", the client's abort" if self.why == "client" else ""
        return f"FINISH_ABORT({self.status}{whose})"


def client_abort(status: int) -> Finish:
    """The verdict ``abort_request`` gives a request of the client's abort."""
    return Finish("abort", status, "client")


def causes_told(rejected: bool, aborted: bool) -> Tuple[str, ...]:
    """The causes (``Finish.cause``) a worker's first answer may give when
    its intake did (not) reject the request and the client's abort did
    (not) reach it: either of those that happened, else a failure or
    completion.  ``answer-matches-cause`` on the model's states and the
    trace rig's reader on the real objects both ask this."""
    told = (("reject",) if rejected else ()) + (("client",) if aborted else ())
    return told or ("failure", "done")


ABORT_400 = Finish("abort", 400)  # intake reject (validate_input_length)
ABORT_500 = Finish("abort", 500)  # transfer / bootstrap failure, prepare_abort(500)
LENGTH = Finish("length", 200)  # FINISH_LENGTH(length=0) on P; normal finish on D


class PStage(enum.Enum):
    """Where a request sits on the prefill worker (queue membership)."""

    ABSENT = "absent"  # not yet received by this worker
    DOOR = "door"  # in _add_request_to_queue, about to hit PrefillBootstrapQueue.add
    BOOTSTRAP = "bootstrap"  # disagg_prefill_bootstrap_queue
    WAITING = "waiting"  # waiting_queue
    CHUNKED = "chunked"  # self.chunked_req: more chunks to launch
    YIELDED = "yielded"  # optimistic chunked req that yielded (overlap): in no queue
    FORWARDED = "forwarded"  # final chunk launched; only in last_batch
    INFLIGHT = "inflight"  # disagg_prefill_inflight_queue
    GONE = "gone"  # in no queue any more (retired, finished, dropped)


class DStage(enum.Enum):
    """Where a request sits on the decode worker."""

    ABSENT = "absent"
    DOOR = "door"  # in _add_request_to_queue, about to hit DecodePreallocQueue.add
    PREALLOC = "prealloc"  # DecodePreallocQueue.queue, receiver created
    TRANSFER = "transfer"  # DecodeTransferQueue: pages reserved, metadata sent
    WAITING = "waiting"  # committed, waiting for the prebuilt batch
    RUNNING = "running"  # decoded at least one step over its KV
    RETRACTED = "retracted"  # retracted_queue, host backup only
    HELD = "held"  # deferred release: failed, still holding pages until ack/timeout
    GONE = "gone"


@attrs.frozen(cache_hash=True)
class PrefillReq:
    """The prefill worker's ``Req`` for one client request, plus its queue stage."""

    stage: PStage = PStage.ABSENT
    origin_pages: int = 0  # len(origin_input_ids), in pages
    to_finish: Optional[Finish] = None
    finished_reason: Optional[Finish] = None
    is_retracted: bool = False
    kv_pages: int = 0  # pages of P's pool held; holds_kv <=> kv_pages > 0
    holds_mamba: bool = False
    holds_metadata: bool = False  # metadata_buffer_index >= 0
    pending_bootstrap: bool = False
    has_sender: bool = False  # disagg_kv_sender is not None
    concluded: Optional[KVPoll] = None  # the sender's latched conclude_state
    send_pages: int = -1  # pages announced by sender.init(num_pages, idx); -1: not inited
    extend_end: int = 0  # pages forwarded so far
    results_due: Tuple[int, ...] = ()  # chunk ends whose overlapped results are pending
    sent: int = 0  # start_send_idx: pages handed to the transfer engine
    requeues_left: int = 0  # optimistic_prefill_attempts not yet used
    pending_chunked_abort: bool = False  # _pending_chunked_abort_req is this req
    session_slot: bool = False  # owns an active conversation slot
    cache_handle: bool = False  # cache_request_handle open
    rejected: bool = False  # history: rejected at this worker's intake
    answer: Optional[int] = None  # status of the first final stream_output, if any
    # history: the client's abort reached P's scheduler while it held this Req
    abort_reached: bool = attrs.field(default=False, metadata=ITF_OMIT)
    # history: prefill's scheduler raised on this request (a poll it has no
    # branch for, release_kv_cache's assertion): the server is down
    crashed: bool = attrs.field(default=False, metadata=ITF_OMIT)
    # history: when the client had the answers the next user of this
    # request's bootstrap_room waits for, prefill's inflight scan was already
    # due for this request (``actions.intake.note_client_waits``)
    scan_due_when_answered: bool = attrs.field(default=False, metadata=ITF_OMIT)

    @property
    def holds_kv(self) -> bool:
        return self.kv_pages > 0

    @property
    def metadata_buffer_index(self) -> int:
        return 0 if self.holds_metadata else -1

    @property
    def inflight_middle_chunks(self) -> int:
        return sum(1 for end in self.results_due if end < self.origin_pages)

    @property
    def retraction_backup(self) -> None:
        return None  # a prefill Req never keeps a host backup


@attrs.frozen(cache_hash=True)
class DecodeReq:
    """The decode worker's ``Req`` and its ``DecodeRequest`` wrapper."""

    stage: DStage = DStage.ABSENT
    origin_pages: int = 0
    to_finish: Optional[Finish] = None
    finished_reason: Optional[Finish] = None
    is_retracted: bool = False
    door_flag: Optional[str] = None  # caller intent at the door: "retracted" | "rebootstrap"
    rebootstrap: bool = False  # pd_rebootstrap_in_progress / DecodeRequest.is_rebootstrap
    has_receiver: bool = False
    receiver_state: Optional[KVPoll] = None  # the receiver's latched poll state
    pages: Tuple[int, ...] = ()  # D pages of the handoff range (kv row)
    prefix_pages: int = 0  # decode_prefix_len (radix hit), counted into pages[:prefix]
    meta_slot: int = -1  # DecodeRequest.metadata_buffer_index
    retraction_backup: bool = False  # host KV copy (kv.retraction_backup)
    expected_checksum: Optional[Tuple] = None  # expected_kv_checksum (None = skip)
    # ABORT/ACK control plane, per decode rank (each rank has its own receiver
    # and KV manager; scheduling decisions are the same on every rank because
    # polls are MIN-reduced, poll_and_all_reduce dc 19:890)
    notified: Tuple[int, ...] = ()  # ranks whose receiver sent ABORT (abort_notified)
    held: Tuple[int, ...] = ()  # ranks still holding the pages in deferred release
    released_on_ack: bool = False  # history: a hold ended on every rank's drain ack
    # decode ranks that have already freed their copy of the request's pages
    # and metadata slot while other ranks still hold them (each rank releases
    # a failed transfer's hold on its own up to 0.5.22): the one picture of
    # the pool (``State.d_pages``) keeps the pages owned until the last rank
    # lets go, and ``State.rank_free_pages`` reads each rank's own pool
    released_on: Tuple[int, ...] = attrs.field(default=(), metadata=ITF_OMIT)
    # the writes, as (request, prefill rank), that were in flight when this
    # request's hold was armed and have neither landed nor been reported
    # failed since: with MC_TRANSFER_TIMEOUT at most the deferral timeout,
    # the hold's deadline cannot pass before they end (``model.clocks``)
    outlasts: Tuple[Tuple[int, int], ...] = attrs.field(default=(), metadata=ITF_OMIT)
    # history: some rank let the hold go at its own deferral deadline, so
    # the hold does not end on every holding rank's drain ack
    deadline_passed: bool = attrs.field(default=False, metadata=ITF_OMIT)
    # history: the decode ranks that admitted this request in a
    # ``pop_preallocated`` (or resumed it) where their peers could not: the
    # ranks' queues differ from here on (``State.halted``)
    split: Tuple[int, ...] = attrs.field(default=(), metadata=ITF_OMIT)
    # DecodeRequest.waiting_for_input: a handshake poll of the prealloc queue
    # read WaitingForInput for it (dc 19:894-901); a new DecodeRequest at the
    # door starts without it.  Kept where the release's handshake may skip
    # its poll (0.5.19, dc 19:871-880), which it does only while every entry
    # has it: the door does not poll, so a new entry is first polled by the
    # next pop_preallocated (``actions.handshake``)
    waiting_for_input: bool = attrs.field(default=False, metadata=ITF_OMIT)
    client_aborted: bool = False  # this worker has handled the client's abort
    session_slot: bool = False
    cache_handle: bool = False
    rejected: bool = False
    was_retracted: bool = False  # history: went through a retract re-entry
    read_foreign: bool = False  # history: attention read a page another request wrote
    answer: Optional[int] = None
    own_data: Optional[bool] = None  # for a 200: did the body come only from own pages
    # history: decode's scheduler raised on this request's poll: the server is down
    crashed: bool = attrs.field(default=False, metadata=ITF_OMIT)

    @property
    def holds_kv(self) -> bool:
        return bool(self.pages)

    @property
    def abort_notified(self) -> bool:
        return bool(self.notified)

    @property
    def reserved_pages(self) -> int:
        """Pages of the handoff range decode attends over (prefix + reserved)."""
        return self.prefix_pages + len(self.pages)

    @property
    def holds_mamba(self) -> bool:
        return False

    @property
    def metadata_buffer_index(self) -> int:
        # D's Req shows -1: the index lives on DecodeRequest (dc 19:297)
        return -1


@attrs.frozen(cache_hash=True)
class Room:
    """Prefill KV manager state for one ``bootstrap_room`` (§5.9)."""

    status: Optional[KVPoll] = None  # request_status[room]
    dst: Optional[Tuple[int, ...]] = None  # transfer_infos[room].dst_kv_indices
    dst_slot: int = -1  # D metadata slot published with the destinations
    prefix: int = 0  # req_to_decode_prefix_len[room]
    failure_record: bool = False  # failure_records[room]
    # _deferred_ack_targets[room]: (decode rank, generation, origin) triples that
    # get an ABORT_ACK once the room drains (0.5.21 also fans out to peers);
    # origin is a history variable: the decode request whose ABORT registered it
    ack_to: Tuple[Tuple[int, int, int], ...] = ()
    peers: Tuple[int, ...] = ()  # decode ranks in transfer_infos[room]
    poisoned: bool = False  # _deferred_ack_poisoned_rooms (0.5.22+): never acks
    # _staging_outstanding[room]: chunks dequeued by the transfer worker whose
    # write has not finished (a defaultdict: 0.5.22+ pop it when a later
    # request re-creates the room, so a late decrement can take it below 0)
    outstanding: int = 0


@attrs.frozen(cache_hash=True)
class DRoom:
    """Decode's state for one ``bootstrap_room``: the drain-ack tracker per
    decode rank (``_deferred_abort_ack_tracker[room]``, cc 19:386-406,
    22:843-886) and the KV manager's ``request_status[room]``.  Keyed by room,
    not by request, so a later request of the room re-arms the tracker and
    shares the status entry."""

    # (rank, generation, armer) of each armed tracker; generation 0 before
    # 0.5.22, which has none; armer (history) is the request that armed it
    armed: Tuple[Tuple[int, int, int], ...] = ()
    # (rank, prefill rank, origin) of each counted ack: the tracker of decode
    # rank ``rank`` holds the prefill ranks that acked (``note_abort_ack(room,
    # prefill_rank)``); origin (history) is the decode request whose ABORT
    # the ack answers
    acked: Tuple[Tuple[int, int, int], ...] = ()
    # decode's own request_status[room]: created by a receiver, popped by
    # any receiver of the room's clear() (the same on every decode rank: a
    # status report reaches all of them)
    status: Optional[KVPoll] = None
    # prefill_response_tracker[room]: (prefill rank, origin) of each Success
    # report counted for the room; Success is applied once every prefill rank
    # (``required_prefill_response_num``) is in it.  Popped with the status
    # entry; origin (history) is the request whose transfer reported it
    responded: Tuple[Tuple[int, int], ...] = ()

    def acked_by(self, rank: int) -> Tuple[int, ...]:
        """The prefill ranks decode rank ``rank``'s tracker has an ack from."""
        return tuple(sorted({q for k, q, _ in self.acked if k == rank}))


@attrs.frozen(cache_hash=True)
class Page:
    """One page of decode's KV pool.  With several prefill ranks (TP), each
    prefill rank writes its own slice of the page (its attention heads):
    ``writer`` is the last writer of prefill rank 0's slice and
    ``slice_writers`` those of ranks 1.. (empty with one prefill rank)."""

    owner: Optional[int] = None  # request holding it, None when free
    writer: Optional[int] = None  # last request whose KV landed in it (rank 0's slice)
    slice_writers: Tuple[Optional[int], ...] = attrs.field(default=(), metadata=ITF_OMIT)

    @property
    def writers(self) -> Tuple[Optional[int], ...]:
        """The last writer of each prefill rank's slice."""
        return (self.writer,) + self.slice_writers

    def foreign_to(self, r: int) -> bool:
        """Some slice holds KV that another request wrote."""
        return any(w is not None and w != r for w in self.writers)

    def written_by(self, r: int) -> bool:
        """Every slice holds r's KV."""
        return all(w == r for w in self.writers)

    def with_slice(self, q: int, r: Optional[int]) -> "Page":
        if q == 0:
            return Page(self.owner, r, self.slice_writers)
        rest = list(self.slice_writers)
        rest[q - 1] = r
        return Page(self.owner, self.writer, tuple(rest))

    def all_written_by(self, r: Optional[int]) -> "Page":
        return Page(self.owner, r, (r,) * len(self.slice_writers))


@attrs.frozen(cache_hash=True)
class MetaSlot:
    """One slot of decode's metadata buffers."""

    owner: Optional[int] = None
    room: int = 0  # bootstrap_room written by the aux write; 0 = not ready
    checksum: Optional[Tuple] = None  # P's digest, when P computes one
    # pages of decode's range the transfer covered (decode prefix + pages prefill
    # announced): no release puts this in the aux; #38704 proposed it
    covered_pages: int = 0


class MsgKind(enum.StrEnum):
    """The kinds of message in flight (the closed vocabulary of ``Msg.kind``).

    Members are named by their wire word, so a member hashes and compares as
    that word, a trace records it as that word, and its ``repr`` (which
    symmetry reduction orders states by) is the word's."""

    metadata = "metadata"  # D->P send_metadata: destination pages and slot
    chunk = "chunk"  # P->transfer worker send_kv_chunk
    write = "write"  # a dequeued chunk's RDMA write into decode pages, in flight
    stray = "stray"  # a write whose batch failed, not landed yet
    status = "status"  # transfer worker -> D: a KVPoll report
    abort = "abort"  # D->P ABORT
    ack = "ack"  # P->D ABORT_ACK
    recompute = "recompute"  # D->P: a retracted request sent back for prefill recompute

    def __repr__(self) -> str:
        return repr(self.value)


# Message kinds that travel decode -> prefill on one cached ZMQ connection per
# bootstrap endpoint (``send_metadata`` and ``receiver.abort``, cc 21:1962-1967,
# 2050-2062): a FIFO channel.  The actions deliver them in order and symmetry
# reduction must not reorder them.
D_TO_P = (MsgKind.metadata, MsgKind.abort)

# Message kinds that travel prefill -> decode: a prefill rank's status reports
# (``sync_status_to_decode_endpoint`` mc 19:1631-1642, ``send_kv_status_message``
# cc 21:501-524) and its ABORT_ACKs (mc 19:2073-2080, ``_send_abort_ack`` cc
# 21:670-686) go through ``_send_multipart_locked``: one cached PUSH socket per
# decode endpoint in the rank's KV manager (cc 19:859-906, 21:1214-1260), whatever
# the room, and decode's one ``decode_thread`` applies them in arrival order (mc
# 19:2140-2206; cc 21:597-627).  A status goes to every decode rank of the room,
# an ack to one: FIFO per (prefill rank, decode rank), across rooms.
P_TO_D = (MsgKind.status, MsgKind.ack)


@attrs.frozen(order=True, cache_hash=True)
class Msg:
    """A message in flight.

    kinds: ``metadata`` (D->P send_metadata), ``chunk`` (P->transfer worker
    send_kv_chunk), ``write`` (a chunk the worker has dequeued: its RDMA write
    to decode pages ``pages`` and, on the last chunk, aux slot ``slot``, is in
    flight), ``stray`` (a write whose batch failed: the worker has moved on,
    the write has not landed yet), ``status`` (worker->D KVPoll), ``abort`` (D->P ABORT), ``ack``
    (P->D ABORT_ACK).  Decode->prefill messages travel on one FIFO
    channel per (decode rank, prefill rank), prefill->decode ones on one per
    (prefill rank, decode rank), each across rooms (``D_TO_P``, ``P_TO_D``).
    """

    kind: MsgKind = attrs.field(converter=MsgKind)
    rid: int
    pages: Tuple[int, ...] = ()  # metadata: dst pages; chunk: [start, end) in P's prompt
    last: bool = False
    slot: int = -1
    poll: Optional[KVPoll] = None
    checksum: Optional[Tuple] = None
    rank: int = 0  # decode rank: sender of metadata/abort, target of ack
    gen: int = 0  # abort: the registration's generation; ack: its echo (0.5.22+)
    covered: int = 0  # write (last chunk): pages of decode's range the aux covers
    # prefill rank (TP): target of metadata/abort; sender of chunk, write,
    # stray, status and ack (each prefill rank has its own KV manager)
    prank: int = attrs.field(default=0, metadata=ITF_OMIT)


_EACH = {"intern": "each"}


@attrs.frozen(cache_hash=True)
class State:
    # intern="each": a tuple of records the exhaustive engine shares one by one
    p: Tuple[PrefillReq, ...] = attrs.field(metadata=_EACH)
    d: Tuple[DecodeReq, ...] = attrs.field(metadata=_EACH)
    # prefill KV manager state, per (room slot, prefill rank)
    rooms: Tuple[Room, ...] = attrs.field(metadata=_EACH)
    d_pages: Tuple[Page, ...]
    d_slots: Tuple[MetaSlot, ...]
    net: Tuple[Msg, ...] = ()  # ordered: chunks of a room are processed FIFO
    aborted_by_client: Tuple[bool, ...] = ()
    d_rooms: Tuple[DRoom, ...] = ()  # decode's per-room trackers, keyed like rooms
    # constant: the room slot of each request when some share a bootstrap_room
    # (the first request using it), () when each has its own; properties read
    # the room of a request through it, as the actions do through the scenario
    room_slots: Tuple[int, ...] = ()
    # Mooncake's ``failed_sessions`` on prefill's KV managers: (instance,
    # prefill rank, decode rank) for each decode session a prefill rank's
    # manager has listed as failed; instance -1 is the one prefill instance
    # of ``transfer_queues = "shared"``, r the own instance of request r with
    # "per-request" (mc 19:1869-1874 adds, 19:2276-2302 probes, sorted)
    failed_sessions: Tuple[Tuple[int, int, int], ...] = ()
    # the prefill instances whose processes have stopped (``[events]
    # prefill_dies``): -1 the one instance of shared transfer queues, r
    # request r's own with "per-request" ones, as in ``failed_sessions``.
    # Left out of a trace file while empty (``ITF_OMIT``)
    prefill_dead: Tuple[int, ...] = attrs.field(default=(), metadata=ITF_OMIT)
    # ... whose registration decode's KV manager dropped at a node failure
    # (``prefill_info_table``), until a fetch of its parallel info registers
    # it again: receivers created meanwhile wait for it
    prefill_lost: Tuple[int, ...] = attrs.field(default=(), metadata=ITF_OMIT)
    # the transfer worker threads that raised out of their loop (``[events]
    # transfer_worker_dies``): (instance, prefill rank), the instance named
    # as in ``prefill_dead``; the thread is gone, its process lives on
    workers_dead: Tuple[Tuple[int, int], ...] = attrs.field(default=(), metadata=ITF_OMIT)

    # -- small derived views used by guards ---------------------------------
    def crashed(self) -> bool:
        """A scheduler raised out of its loop: ``run_scheduler_process`` logs
        the exception and kills its server, so nothing of either worker's
        moves on in the model (a step after it is no step of the code's)."""
        return any(r.crashed for r in self.p) or any(r.crashed for r in self.d)

    def diverged(self) -> bool:
        """Decode's ranks took different scheduling decisions for a request
        (``DecodeReq.split``): their queues differ, so they enter their next
        collectives with different queues (one waits in a poll all-reduce
        while a peer is in another collective, or the lengths differ).  The
        model keeps one picture of the ranks in lockstep and does not follow
        them past this point."""
        return any(r.split for r in self.d)

    def prefill_down(self, rid: int) -> bool:
        """The prefill instance that serves request ``rid`` has died: none of
        its processes (scheduler, bootstrap thread, transfer workers, probe
        thread) takes a step any more."""
        dead = self.prefill_dead
        return bool(dead) and (-1 in dead or rid in dead)

    def halted(self) -> bool:
        """Nothing moves in the model from here: a scheduler crashed, or
        decode's ranks diverged (what each then does is no longer one
        picture)."""
        return self.crashed() or self.diverged()

    def p_pages_used(self) -> int:
        return sum(r.kv_pages for r in self.p)

    def p_metadata_used(self) -> int:
        return sum(1 for r in self.p if r.holds_metadata)

    def free_d_pages(self) -> Tuple[int, ...]:
        return tuple(i for i, pg in enumerate(self.d_pages) if pg.owner is None)

    def rank_free_pages(self, k: int) -> Tuple[int, ...]:
        """The pages decode rank ``k``'s own pool has free: free in the
        picture, or held only by ranks other than ``k``."""
        return tuple(i for i, pg in enumerate(self.d_pages)
                     if pg.owner is None or k in self.d[pg.owner].released_on)

    def rank_free_slots(self, k: int) -> int:
        """How many metadata slots decode rank ``k``'s allocator has free."""
        return sum(1 for sl in self.d_slots
                   if sl.owner is None or k in self.d[sl.owner].released_on)

    def msgs(self, kind: str, rid: int) -> Tuple[Msg, ...]:
        return tuple(m for m in self.net if m.kind == kind and m.rid == rid)

    def room_slot(self, rid: int) -> int:
        return self.room_slots[rid] if self.room_slots else rid

    @property
    def prefill_ranks(self) -> int:
        return len(self.rooms) // len(self.p)

    def room_index(self, rid: int, q: int = 0) -> int:
        """Where prefill rank q's entry for request rid's room is in ``rooms``."""
        return self.room_slot(rid) * self.prefill_ranks + q

    def rooms_of_slot(self, slot: int) -> Tuple[Room, ...]:
        """Every prefill rank's entry for one room slot."""
        n = self.prefill_ranks
        return self.rooms[slot * n:(slot + 1) * n]

    def room_msgs(self, kind: str, rid: int) -> Tuple[Msg, ...]:
        """Messages of one kind on request rid's room, whichever request of the
        room put them there, oldest first (the wire names the room)."""
        if not self.room_slots:
            return self.msgs(kind, rid)
        k = self.room_slots[rid]
        return tuple(m for m in self.net if m.kind == kind and self.room_slots[m.rid] == k)


# the copy-with-changes functions of these records, and the drafting of one
# step's new State, live in ``model.drafting`` (re-exported here)
from reqmodel.model import drafting as _drafting  # noqa: E402

_drafting.bind(State)
DRAFTING, _Drafting, _HASH_CACHE = _drafting.DRAFTING, _drafting._Drafting, _drafting._HASH_CACHE
replace = _drafting.replace
