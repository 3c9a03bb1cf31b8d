"""Drive the KV managers' bookkeeping of one released wheel: the
``status_merge`` and ``abort_ack`` seams (cases from ``kvcases.py``).

Runs in the conformance worker beside ``adapter.py``.  Real and unmodified:
``MooncakeKVManager`` (with ``CommonKVManager`` under it) and
``MooncakeKVSender``, built with ``object.__new__`` and given the bookkeeping
fields their methods read, because the constructors open ZMQ sockets, a
transfer engine and threads.  The sockets are replaced at the byte
boundary: what a manager sends goes to ``_send_multipart_locked``, a spy
that keeps the frames; what it receives comes from an in-process queue of
frames (``FrameQueue``) read by the release's own ``bootstrap_thread`` or
``decode_thread``, run to the end of the queue in the calling thread.  The
frames a thread receives are made by the real code of the other side where
the release has a method for it (status reports, ABORT_ACKs, 0.5.22+
ABORTs); the ABORT of 0.5.19-0.5.21 is the four frames
``_send_abort_notification`` writes inline (cc 19:1641-1660,
21:2055-2061).  Release differences by feature detection only.
"""
from __future__ import annotations

import collections
import threading
import types
from typing import Any, Dict, List, Optional
from unittest import mock

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common import conn as cc
from sglang.srt.disaggregation.mooncake import conn as mc

ROOM = 7
_DECODE_PORT = 17000


def _ip(k: int) -> str:
    return f"10.0.0.{k + 1}"


def _rank_of_endpoint(endpoint: str) -> int:
    """``tcp://10.0.0.<k+1>:<port>`` -> decode rank k."""
    host = endpoint.split("//")[-1].rsplit(":", 1)[0]
    return int(host.rsplit(".", 1)[1]) - 1


def poll_name(value) -> Optional[str]:
    """``KVPoll`` is a class of int constants, not an enum."""
    if value is None:
        return None
    return next(n for n in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring",
                            "Success") if getattr(KVPoll, n) == value)


class _Drained(Exception):
    """The frame queue is empty: ends a thread loop the case started."""


class FrameQueue:
    """An in-process stand-in for a ZMQ PULL socket."""

    def __init__(self, frames: List[List[bytes]]):
        self.frames = list(frames)

    def recv_multipart(self):
        if not self.frames:
            raise _Drained
        return self.frames.pop(0)


class _InlineThread:
    """``threading.Thread`` for the duration of a case: ``start()`` runs the
    target in the calling thread until the frame queue is drained."""

    def __init__(self, target=None, daemon=None, **_):
        self.target = target

    def start(self):
        try:
            self.target()
        except _Drained:
            pass


# ------------------------------------------------------------------ managers

HAS_GENERATIONS = hasattr(cc, "AckTarget")  # 0.5.22+: targets and acks carry one
HAS_FANOUT_SNAPSHOT = hasattr(cc.CommonKVManager, "_abort_ack_fanout_targets")  # 0.5.21
HAS_CONCLUDE = hasattr(cc.CommonKVManager, "conclude_transfer")  # 0.5.20+


def manager(rank: int, deferred: bool):
    """A ``MooncakeKVManager`` whose ``_prefill_unique_rank()`` is ``rank``
    (a prefill TP rank; on decode the value is unused), with empty
    bookkeeping and a spy for everything it sends."""
    mgr = object.__new__(mc.MooncakeKVManager)
    mgr.request_status = {}
    mgr.failure_records = {}
    mgr.failure_lock = threading.Lock()
    mgr.transfer_infos = {}
    mgr.req_to_decode_prefix_len = {}
    mgr._deferred_ack_targets = {}
    mgr._deferred_ack_poisoned_rooms = set()
    mgr._deferred_ack_fanout_snapshots = {}
    mgr._staging_outstanding = collections.defaultdict(int)
    mgr._deferred_abort_ack_tracker = {}
    mgr._deferred_abort_generation = 0
    mgr.prefill_response_tracker = collections.defaultdict(set)
    mgr.required_prefill_response_num_table = {}
    mgr.addr_to_rooms_tracker = collections.defaultdict(set)
    mgr.deferred_bootstrap = None
    mgr.defer_decode_allocation = False
    mgr.enable_deferred_decode_kv_release = deferred
    mgr.enable_staging = False
    mgr._staging_handler = None
    mgr._staging_ctx = None
    mgr.attn_tp_rank, mgr.pp_size, mgr.pp_rank = rank, 1, 0
    mgr.attn_cp_size, mgr.attn_cp_rank = 1, 0
    mgr.server_args = types.SimpleNamespace(enable_pd_role_switch=False)
    mgr._stopped = False
    mgr._worker_threads = []
    mgr.local_ip, mgr.rank_port = _ip(0), _DECODE_PORT
    # the transfer engine is read only for its session id (0.5.23's
    # build_receiver_metadata_message); nothing here transfers
    mgr.engine = types.SimpleNamespace(get_session_id=lambda: "decode-session")
    mgr.sent = []
    mgr._send_multipart_locked = (
        lambda endpoint, frames, is_ipv6=False: mgr.sent.append((endpoint, list(frames))))
    return mgr


def _run_thread(mgr, start: str, frames: List[List[bytes]]) -> None:
    mgr.server_socket = FrameQueue(frames)
    with mock.patch.object(threading, "Thread", _InlineThread), \
            mock.patch.object(mc.MooncakeKVManager, "_start_heartbeat_checker_thread",
                              lambda self: None, create=True):
        getattr(mgr, start)()


def _target(k: int, gen: int):
    if HAS_GENERATIONS:
        return cc.AckTarget(_ip(k), _DECODE_PORT + k, gen)
    return (_ip(k), _DECODE_PORT + k)


def seed_prefill(mgr, room: Dict[str, Any]) -> None:
    """Give prefill rank's manager the model's record of the room."""
    if room["status"] is not None:
        mgr.request_status[ROOM] = getattr(KVPoll, room["status"])
    if room["failure_record"]:
        mgr.failure_records[ROOM] = "seeded by reqmodel"
    if room["peers"] is not None:
        mgr.transfer_infos[ROOM] = {
            f"session-{k}": types.SimpleNamespace(endpoint=_ip(k), dst_port=_DECODE_PORT + k,
                                                  is_dummy=False)
            for k in room["peers"]}
        mgr.req_to_decode_prefix_len[ROOM] = 0
    ack_to = room["ack_to"]
    if ack_to:
        if HAS_GENERATIONS:
            mgr._deferred_ack_targets[ROOM] = {(_ip(k), _DECODE_PORT + k): _target(k, g)
                                               for k, g in ack_to}
        else:
            mgr._deferred_ack_targets[ROOM] = _target(*ack_to[0])
            if HAS_FANOUT_SNAPSHOT:
                mgr._deferred_ack_fanout_snapshots[ROOM] = [_target(k, g) for k, g in ack_to[1:]]
    if room["poisoned"]:
        mgr._deferred_ack_poisoned_rooms.add(ROOM)
    if room["outstanding"]:
        mgr._staging_outstanding[ROOM] = room["outstanding"]


def _ack_targets(mgr) -> List[List[int]]:
    got = mgr._deferred_ack_targets.get(ROOM)
    if got is None:
        return []
    if HAS_GENERATIONS:
        return sorted([_rank_of_endpoint(f"//{t.ip}:{t.port}"), t.generation]
                      for t in got.values())
    ranks = {_rank_of_endpoint(f"//{got[0]}:{got[1]}")}
    for ip, port in mgr._deferred_ack_fanout_snapshots.get(ROOM, ()):
        ranks.add(_rank_of_endpoint(f"//{ip}:{port}"))
    return [[k, 0] for k in sorted(ranks)]


def _sent(mgr):
    acks, reports = [], set()
    for endpoint, frames in mgr.sent:
        if frames and frames[0] == b"ABORT_ACK":
            acks.append([_rank_of_endpoint(endpoint), int(frames[2]),
                         int(frames[3]) if len(frames) > 3 else 0])
        else:
            reports.add(poll_name(_parse_status(mgr, frames)[1]))
    return sorted(acks), sorted(reports)


def _parse_status(mgr, frames):
    """(room, status, prefill rank) of a status report's frames."""
    if hasattr(mgr, "parse_kv_status_message"):
        return mgr.parse_kv_status_message(frames)[:3]
    return tuple(int(f) for f in frames[:3])


def prefill_observation(mgr, reports: bool = False) -> Dict[str, Any]:
    acks, sent_reports = _sent(mgr)
    out = {"status": poll_name(mgr.request_status.get(ROOM)),
           "failure_record": ROOM in mgr.failure_records,
           "transfer_infos": ROOM in mgr.transfer_infos,
           "ack_to": _ack_targets(mgr),
           "poisoned": ROOM in mgr._deferred_ack_poisoned_rooms,
           "outstanding": mgr._staging_outstanding.get(ROOM, 0),
           "acks": acks}
    if reports and HAS_CONCLUDE:
        out["reports"] = sent_reports
    return out


def sender(mgr):
    """A ``MooncakeKVSender`` of the room on ``mgr``, not yet concluded."""
    s = object.__new__(mc.MooncakeKVSender)
    s.kv_mgr = mgr
    s.bootstrap_room = ROOM
    s.conclude_state = None
    s._owns_bootstrap_room = True
    s.trace_ctx = mock.MagicMock()
    return s


def abort_frames(k: int, gen: int) -> List[bytes]:
    """Decode rank k's ABORT for the room as it goes on the wire."""
    if hasattr(cc, "AbortNotification"):
        return cc.AbortNotification(room=ROOM, decode_ip=_ip(k), decode_port=_DECODE_PORT + k,
                                    generation=gen or None).to_zmq()
    return [b"ABORT", str(ROOM).encode("ascii"), _ip(k).encode("ascii"),
            str(_DECODE_PORT + k).encode("ascii")]


def kv_prefill(case: Dict[str, Any]) -> Dict[str, Any]:
    """One operation on prefill rank ``q``'s manager, from the model's record."""
    mgr = manager(case["q"], case["deferred"])
    seed_prefill(mgr, case["room"])
    op = case["op"]
    if op == "update":
        mgr.update_status(ROOM, getattr(KVPoll, case["status"]))
    elif op == "conclude":
        status = getattr(KVPoll, case["status"])
        if HAS_CONCLUDE and status == KVPoll.Success:
            # the worker reports a Success to the destinations it looked up
            # when it took the chunk (mc 21:2143-2147, 21:2355-2363), which
            # exist: it takes a chunk only for a room with destinations
            peers = case["room"]["peers"] or [0]
            mgr.conclude_transfer(bootstrap_room=ROOM, status=status,
                                  targets=[(_ip(k), _DECODE_PORT + k) for k in peers])
        elif HAS_CONCLUDE:  # conclude_failure: the live transfer_infos (mc 21:2161)
            mgr.conclude_failure(bootstrap_room=ROOM, failure_reason="reqmodel")
        elif status == KVPoll.Failed:  # 0.5.19's worker, inline (mc 19:1723-1729)
            mgr.record_failure(ROOM, "reqmodel")
            mgr.update_status(ROOM, KVPoll.Failed)
        else:  # mc 19:1930-1936
            mgr.update_status(ROOM, KVPoll.Success)
    elif op == "abort":
        sender(mgr).abort()
    elif op == "drain":
        mgr._maybe_ack_drained_abort(ROOM)
    elif op == "clear":
        sender(mgr).clear()
    elif op == "failure_exception":
        try:
            sender(mgr).failure_exception()
        except cc.KVTransferError:
            pass
    elif op == "abort_notification":
        _run_thread(mgr, "start_prefill_thread", [abort_frames(case["rank"], case["gen"])])
    elif op == "register":
        target = _target(case["rank"], case["gen"])
        if HAS_GENERATIONS:
            mgr.register_deferred_ack_target(ROOM, target)
        else:
            mgr.register_deferred_ack_target(ROOM, *target)
        mgr._maybe_ack_drained_abort(ROOM)
    else:
        raise ValueError(f"unknown prefill operation {op!r}")
    return prefill_observation(mgr, reports=op == "conclude")


# -------------------------------------------------------------------- decode

def seed_decode(mgr, room: Dict[str, Any], pranks: int, next_gen: int) -> None:
    # a receiver creates the status entry, the response tracker and the
    # expected count together, and clear() pops them together (cc
    # 19:1381-1404, 19:1622-1624; 23:2509-2510, 23:2553, 23:2935-2937)
    if room["status"] is not None:
        mgr.request_status[ROOM] = getattr(KVPoll, room["status"])
        mgr.required_prefill_response_num_table[ROOM] = pranks
        mgr.prefill_response_tracker[ROOM] = set(room["responded"])
    tracker = room["tracker"]
    if tracker is not None:
        acks = set(tracker["acks"])
        mgr._deferred_abort_ack_tracker[ROOM] = (
            cc.DeferredAbortAckState(generation=tracker["gen"], prefill_ranks=acks)
            if HAS_GENERATIONS else acks)
    mgr._deferred_abort_generation = max(next_gen - 1, 0)


def decode_observation(mgr, k: int) -> Dict[str, Any]:
    t = mgr._deferred_abort_ack_tracker.get(ROOM)
    if t is not None:
        t = ({"gen": t.generation, "acks": sorted(t.prefill_ranks)} if HAS_GENERATIONS
             else {"gen": 0, "acks": sorted(t)})
    return {"status": poll_name(mgr.request_status.get(ROOM)),
            "responded": sorted(mgr.prefill_response_tracker.get(ROOM, ())),
            "tracker": t}


def status_frames(q: int, status) -> List[bytes]:
    """Prefill rank q's status report for the room, made by its real encoder."""
    mgr = manager(q, False)
    if hasattr(mgr, "_encode_kv_status_message"):
        return mgr._encode_kv_status_message(bootstrap_room=ROOM, status=status,
                                             failure_reason=None)
    mgr.sync_status_to_decode_endpoint(_ip(0), _DECODE_PORT, ROOM, status, q)
    return mgr.sent[-1][1]


def ack_frames(q: int, k: int, gen: int) -> List[bytes]:
    """Prefill rank q's ABORT_ACK to decode rank k, made by its real sender."""
    mgr = manager(q, True)
    if HAS_GENERATIONS:
        mgr._send_abort_ack(ROOM, _target(k, gen))
    else:
        mgr._send_abort_ack(_ip(k), _DECODE_PORT + k, ROOM)
    return mgr.sent[-1][1]


def kv_decode(case: Dict[str, Any]) -> Dict[str, Any]:
    """One operation on decode rank ``k``'s manager, from the model's record."""
    k = case["k"]
    mgr = manager(k, True)
    seed_decode(mgr, case["room"], case["pranks"], case["next_gen"])
    op = case["op"]
    extra: Dict[str, Any] = {}
    if op == "report":
        _run_thread(mgr, "start_decode_thread",
                    [status_frames(case["prank"], getattr(KVPoll, case["status"]))])
    elif op == "arm":
        extra["gen"] = mgr.register_deferred_abort_room(ROOM) or 0
    elif op == "ack":
        _run_thread(mgr, "start_decode_thread", [ack_frames(case["prank"], k, case["gen"])])
    elif op == "safe":
        extra["safe"] = mgr.is_abort_release_safe(ROOM, case["pranks"])
    elif op == "clear_tracker":
        mgr.clear_deferred_abort_state(ROOM)
    else:
        raise ValueError(f"unknown decode operation {op!r}")
    return dict(decode_observation(mgr, k), **extra)


def kv_manager(case: Dict[str, Any]) -> Dict[str, Any]:
    return kv_decode(case) if "k" in case else kv_prefill(case)


SEAMS = {"status_merge": kv_manager, "abort_ack": kv_manager}
