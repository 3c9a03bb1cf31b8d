"""Faults around requests: a prefill instance dies, or goes silent to
decode's heartbeat, and decode's heartbeat thread declares it lost; a
transfer worker thread raises out of its loop while its process runs on.

A dead instance's processes take no step (``core._alive_gated``, on every
action of a ``prefill.*`` process).  Decode learns of it only through its
heartbeat: each decode KV manager runs a checker thread
(``_start_heartbeat_checker_thread``, cc 19:1083, 20:1311, 21:1413,
22:1811, 23:1998) that sends ``GET /health`` to every prefill bootstrap
address in its ``prefill_info_table`` every
``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`` (5 s) with a (2, 3) s timeout;
after ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`` (2) failures in a row
it calls ``_handle_node_failure(addr)``, which sends nothing to prefill and
marks Failed every room it tracks for that address whose
``request_status`` is not Success.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``19:`` ... ``23:``; ``cc`` = disaggregation/common/conn.py).
"""
from __future__ import annotations

from typing import List

from reqmodel.model.actions.core import Ctx, Effect, Needs, PRANK_ARG, action, replace, set_d
from reqmodel.model.actions.kvmanager import (d_room_of, names_instance, prefill_instance,
                                              receiver_fail, room_of, served_with, set_d_room,
                                              set_room, takes_chunks)
from reqmodel.model.actions.transfer import dequeue_ranks, worker_of
from reqmodel.model.actions.transport import consume, prank_args, prank_of, rank_msgs
from reqmodel.model.state import DStage, KVPoll, MsgKind, PStage, State

# the request statuses ``_handle_node_failure`` overwrites: a room in
# ``request_status`` not at Success (cc 19:1161-1170, 20:1389-1398,
# 21:1503-1512, 22:1901-1910, 23:2091-2100); a
# Failed one is Failed already
_LOSABLE = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring)


# what lives in a prefill process and goes with it: its transfer queues'
# chunks and the RDMA writes its workers started
_GONE_WITH_PREFILL = (MsgKind.chunk, MsgKind.write, MsgKind.stray)


def _in_flight(s: State, i: int) -> bool:
    """Request i is at a worker and not finished with on both."""
    return (s.p[i].stage not in (PStage.ABSENT, PStage.GONE)
            or s.d[i].stage not in (DStage.ABSENT, DStage.GONE))


def _may_die(c, s, r):
    return (names_instance(c, r, "prefill_dies") and not s.prefill_down(r)
            and any(_in_flight(s, i) for i in served_with(c, r)))


@action("prefill", guard=_may_die, event="prefill_dies")
def p_dies(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """The prefill instance serving request r dies: a killed or crashed
    server, or its node lost.  SGLang runs one server per instance (its
    tokenizer manager, which also runs the bootstrap server, cc 21:2104-2106,
    and its scheduler processes); a scheduler that raises takes its server
    down (``run_scheduler_process`` ... ``kill_itself_when_parent_died``),
    so the instance stops whole: its scheduler loop, its KV managers'
    bootstrap threads, transfer workers and probe threads, and its
    bootstrap server's ``/health``.  What lived in its processes goes with
    them: the chunks queued for its transfer workers, and the writes they
    had started, which either landed before (an earlier ``xfer_write``) or
    never land (the RDMA queue pairs of a dead process are torn down with
    it).  A report or ack it had sent still arrives (the model does not lose
    a message once sent; losing it leaves decode to its heartbeat, which it
    needs anyway).  The client's connection to prefill fails (its prefill
    leg is answered by the connection error, ``properties.answered``).  Not
    modelled: the instance coming back (re-registration)."""
    dead = tuple(sorted(set(s.prefill_dead) | {prefill_instance(c, r)}))
    mine = set(served_with(c, r))
    net = tuple(m for m in s.net if not (m.rid in mine and m.kind in _GONE_WITH_PREFILL))
    return replace(s, prefill_dead=dead, net=net), ()


def _tracked(c: Ctx, s: State, r: int) -> List[int]:
    """The requests of r's prefill instance whose room decode's KV manager
    tracks and ``_handle_node_failure`` would fail: a receiver of it exists
    (``addr_to_rooms_tracker[addr]`` gains the room in the receiver's
    ``__init__``, cc 19:1380, 20:1608, 21:1741, 22:2195, 23:2508, and loses
    it in ``clear()``, cc 20:1853, 21:2012, 22:2546, 23:2938) and the
    room's ``request_status`` is neither Success nor Failed."""
    return [i for i in served_with(c, r)
            if s.d[i].has_receiver and d_room_of(c, s, i).status in _LOSABLE]


def _registered(c: Ctx, s: State, r: int) -> bool:
    """Decode's KV manager has r's instance in ``prefill_info_table``, the
    addresses its heartbeat probes (``addresses = list(self.prefill_info_table
    .keys())``, cc 21:1425-1426)."""
    return prefill_instance(c, r) not in s.prefill_lost


def _heartbeat_finds(c, s, r) -> bool:
    """Decode's heartbeat probes r's instance and a node failure there would
    fail a tracked room."""
    return _registered(c, s, r) and bool(_tracked(c, s, r))


def _lost_dead(c, s, r):
    return names_instance(c, r) and s.prefill_down(r) and _heartbeat_finds(c, s, r)


def _heartbeat_fails(c, s, r):
    return (names_instance(c, r, "prefill_silent") and not s.prefill_down(r)
            and _heartbeat_finds(c, s, r))


def _node_failure(c: Ctx, s: State, r: int) -> Effect:
    """``_handle_node_failure(addr)`` (cc 19:1133-1175, 20:1361-1403,
    21:1475-1518, 22:1873-1916, 23:2060-2105): under the connection lock it
    drops the address's cached bootstrap infos, its ``prefill_info_table``
    entry and its room tracker, then sets Failed on each tracked room still
    in ``request_status`` and not at Success ("Lost connection with prefill
    instance"); it sends nothing, so no ABORT reaches prefill from here.
    Decode's scheduler sees the Failed at its next poll of the request
    (``pop_preallocated``'s handshake, ``pop_transferred``), as it sees a
    Failed report: a 500, and its pages freed or held by the release's rule
    (0.5.21+ send the ABORT then, ``ensure_abort_notified(force_arm=True)``).
    Each decode rank's manager has its own heartbeat thread; the model takes
    the first rank's, since one rank's Failed fails the MIN-reduced poll on
    every rank.  The address is gone from ``prefill_info_table``
    (``State.prefill_lost``): the heartbeat no longer probes it, and a
    receiver created afterwards waits for its parallel info
    (``kvmanager.receiver_init``, :func:`d_fetch_prefill_info`)."""
    for i in _tracked(c, s, r):
        s = receiver_fail(c, s, i)
    lost = tuple(sorted(set(s.prefill_lost) | {prefill_instance(c, r)}))
    return replace(s, prefill_lost=lost), ()


@action("decode", guard=_lost_dead, scenarios=lambda sc: sc.events.any("prefill_dies"))
def d_node_failure(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Decode's heartbeat thread finds r's prefill instance dead: its
    ``/health`` fails ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`` times
    in a row (2 probes, 5 s apart: about 10 to 16 s after the death; env
    19:658-659, 21:706-707, 23:761-762; the loop cc 19:1086-1125, 21:1419-1462)
    and it calls ``_handle_node_failure`` (:func:`_node_failure`).  The deployment's
    own step: no timeout of a request, no event."""
    return _node_failure(c, s, r)


@action("decode", guard=_heartbeat_fails, event="prefill_silent")
def d_heartbeat_lost(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Decode's heartbeat to r's prefill instance fails twice in a row while
    the instance runs on: its bootstrap server (a thread of prefill's
    tokenizer-manager process, cc 21:2104-2106, apart from the scheduler and
    the KV manager's sockets) does not answer ``/health`` within (2, 3) s, or
    the route to its port is lost while the ZMQ and RDMA paths still work.
    Decode then runs ``_handle_node_failure`` (:func:`_node_failure`) on an
    instance that goes on prefilling and writing.  0.5.19 to 0.5.22 keep the
    failure count at its maximum afterwards (reset only in 0.5.23, cc
    23:2080), so after a re-registration one missed probe is enough."""
    return _node_failure(c, s, r)


def _pending(c: Ctx, s: State, r: int):
    """The requests of r's instance whose receiver waits in ``pending_reqs``
    for the instance's parallel info."""
    return [i for i in served_with(c, r)
            if s.d[i].stage is DStage.PREALLOC and s.d[i].receiver_state is KVPoll.Bootstrapping]


def _awaits_fetch(c, s, r) -> bool:
    """Decode dropped r's instance and a receiver of it waits for its info."""
    return (bool(s.prefill_lost) and names_instance(c, r) and not _registered(c, s, r)
            and bool(_pending(c, s, r)))


def _fetch_answers(c, s, r):
    return _awaits_fetch(c, s, r) and not s.prefill_down(r)


@action("decode", guard=_fetch_answers,
        scenarios=lambda sc: sc.events.any("prefill_silent"))
def d_fetch_prefill_info(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``pop_preallocated`` first resolves the pending receivers
    (``_resolve_pending_reqs``, dc 19:1014, 20:1030, 21:1165, 22:1237,
    23:1267): ``_ensure_prefill_info`` fetches the instance's parallel info
    from its bootstrap server (``try_ensure_parallel_info``, cc 19:618,
    20:855, 21:929, 22:1157, 23:1293), which, now answering, registers it
    again; each pending receiver then runs ``init()`` and waits for input.
    The deployment's own step on a live instance whose bootstrap server
    answers again (the heartbeat resumes probing it)."""
    for i in _pending(c, s, r):
        st = c.release.update_status(d_room_of(c, s, i).status, KVPoll.WaitingForInput)
        s = set_d(set_d_room(c, s, i, status=st), i, receiver_state=(
            st if st in (KVPoll.Failed, KVPoll.Success) else KVPoll.WaitingForInput))
    lost = tuple(x for x in s.prefill_lost if x != prefill_instance(c, r))
    return replace(s, prefill_lost=lost), ()


def _fetch_gives_up(c, s, r):
    return _awaits_fetch(c, s, r) and s.prefill_down(r)


@action("decode", guard=_fetch_gives_up,
        scenarios=lambda sc: sc.events.any("prefill_dies"))
def d_fetch_fails(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """The fetch of a dead instance's parallel info fails
    ``_max_ensure_retries`` (15) times, at least ``_ensure_retry_interval``
    (1 s) apart (dc 19:374-376, 23:441-443): ``_ensure_prefill_info`` aborts
    every pending receiver of the address (``kv_receiver.abort()``, dc
    19:958-964, 20:974-980, 21:1109-1115, 22:1181-1187, 23:1211-1217):
    "Aborted by AbortReq." and Failed, with no ABORT sent (the receiver has
    no bootstrap infos, cc 21:2016-2035); the handshake of the same call
    then answers them 500 (``d_prealloc_drop``).  The deployment's own step,
    about 15 s after the receivers' arrival."""
    for i in _pending(c, s, r):
        s = set_d(receiver_fail(c, s, i), i, receiver_state=KVPoll.Failed)
    return s, ()


def _raising_ranks(c, s, r):
    """Prefill ranks whose worker can take r's chunk for a known room with
    decode's destinations: the part of the loop past its skip and
    failed-session checks, where the sends run."""
    return [q for q in dequeue_ranks(c, s, r) if takes_chunks(room_of(c, s, r, q))]


def _worker_may_raise(c, s, r):
    return bool(_raising_ranks(c, s, r))


@action("transfer", guard=_worker_may_raise, needs=Needs(msgs={MsgKind.chunk}),
        event="transfer_worker_dies",
        choices=lambda c, s, r: prank_args(c, _raising_ranks(c, s, r)), arg_names=PRANK_ARG)
def xfer_worker_raises(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Prefill rank q's transfer worker raises while handling r's chunk, before
    it submits the chunk's writes (an ``IndexError`` in ``set_transfer_blocks``
    on an empty block list, a ``KeyError`` on ``decode_kv_args_table``: any
    exception in the loop's body).  Every release catches it only to raise
    ``RuntimeError("Transfer thread failed ... Prefill instance ... is dead")``
    (mc 19:2000-2004, 20:2173-2177, 21:2423-2427, 22:2806-2812,
    23:2878-2884) out of ``transfer_worker``, so the thread ends; it is a
    plain ``threading.Thread`` (mc 19:259, 21:288, 23:358) and nothing in the
    process watches it, so the scheduler, the bootstrap thread and the
    server's ``/health`` run on and decode's heartbeat sees nothing.  The
    chunk was dequeued and counted outstanding (mc 19:1670-1676) and is never
    finished: no write, no status, no ``worker_done``.  0.5.22+ first poison
    the room's deferred ack (mc 22:2808-2809, 23:2880-2881; cc 22:945-948).
    Every later chunk on the worker's queue stays there (``State.workers_dead``
    closes the queue: ``transfer._chunk_next``); its rooms wait for a timeout.
    Writes submitted for earlier chunks have landed: a worker waits for its
    batch before taking the next chunk (``batch_transfer_sync``)."""
    q = prank_of(arg)
    s = consume(s, rank_msgs(s, "chunk", r, q)[0])
    room = room_of(c, s, r, q)
    s = set_room(c, s, r, q=q, outstanding=room.outstanding + 1)
    if c.release.poison_failed_rooms:
        s = set_room(c, s, r, q=q, poisoned=True, ack_to=())
    dead = tuple(sorted(set(s.workers_dead) | {worker_of(c, r, q)}))
    return replace(s, workers_dead=dead), ()
