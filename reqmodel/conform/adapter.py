"""Drive one released SGLang wheel at the seams the model describes.

Runs inside the conformance environment (``reqmodel conform --setup``), one
process per release, with the release's tree first on ``sys.path``: standard
library, torch and sglang only, nothing of reqmodel. Every difference between
releases is absorbed here, by feature detection (``hasattr``, signatures),
never by version string (conformance-notes.md §5).

Real and unmodified: ``Req`` and ``SamplingParams``, ``validate_input_length``
and ``Req.set_finish_with_abort`` (intake), ``PrefillBootstrapQueue.add`` with
``create_sender`` and its capacity check (P1), ``DecodePreallocQueue.add`` with
``_create_receiver_and_enqueue`` (D1), ``is_unadmitted_reject`` and the unbound
``Scheduler.retire_unadmitted_request`` where a release has them, the prefill
mixin's ``process_batch_result_disagg_prefill`` (P5) and
``process_disagg_prefill_inflight_queue`` (P6) on an empty subclass, the
real poll over a one-rank gloo group, and the wheel's FAKE transport
(``FakeKVSender``/``FakeKVReceiver``).

Spies at the effect boundary: ``output_streamer.stream_output``, the door's
call of ``retire_unadmitted_request`` (the real one still runs),
``send_kv_chunk``, ``release_kv_cache`` and the prefill cache hook; tree
cache, beam coordinator and metrics are mocks. Decode's capacity check is
overridden to admit (its byte budget needs a real allocator); cases where the
model's decode capacity check would reject are not sent (see cases.py).
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import pathlib
import threading
import time
import types
from array import array
from typing import Any, Dict, Optional
from unittest import mock

import torch.distributed as dist

from sglang.srt import runtime_context as rc
from sglang.srt.disaggregation import decode as dc
from sglang.srt.disaggregation import prefill as pf
from sglang.srt.disaggregation import utils as du
from sglang.srt.managers import schedule_batch as sb
from sglang.srt.managers import scheduler as sch
from sglang.srt.managers import utils as mu
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

import kvadapter  # beside this file on the worker's path
import sourcescan

BOOTSTRAP_PORT = 8998
_PARALLEL = types.SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                  attn_tp_rank=0, attn_tp_size=1, attn_cp_rank=0,
                                  attn_cp_size=1, enable_prefill_context_parallel=False)
_GROUP = None


def setup() -> Dict[str, Any]:
    """Publish server arguments, pin rank 0, and build a real one-rank gloo
    group. Returns the features this release has (for the report)."""
    global _GROUP
    rc.reset_context()
    rc.publish(ServerArgs(model_path="dummy"), role="tokenizer")
    # set_finish_with_abort and create_sender read the process's rank; the
    # tokenizer role publishes none
    for module in (sb, pf, dc, du):
        if hasattr(module, "get_parallel"):
            module.get_parallel = lambda: _PARALLEL
    # the DeepSeek-V4 rebootstrap predicate (0.5.21 name, 0.5.22 name) reads a
    # real allocator; no modelled request is a DSV4 one
    for name in ("dsv41_dspark_needs_rebootstrap", "dsv4_needs_rebootstrap"):
        if hasattr(dc, name):
            setattr(dc, name, lambda *a, **k: False)
    if not dist.is_initialized():
        # an in-memory store: one rank needs no rendezvous, and a file store
        # would leave its file behind in the temporary directory
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    _GROUP = dist.group.WORLD
    return features()


def features() -> Dict[str, Any]:
    return {
        "is_unadmitted_reject": hasattr(du, "is_unadmitted_reject"),
        "retire_unadmitted_request": hasattr(sch.Scheduler, "retire_unadmitted_request"),
        "prefill_max_input_len": "max_input_len" in inspect.getsource(
            pf.PrefillBootstrapQueue._check_if_req_exceed_kv_capacity),
        "decode_init_receiver": hasattr(dc.DecodePreallocQueue, "_init_receiver"),
        "decode_host_receive": hasattr(dc.DecodePreallocQueue, "_pre_alloc_host"),
        "host_destination_classes": sourcescan.host_destination_classes(
            pathlib.Path(dc.__file__).parent),
        "force_armed_failure_calls": sourcescan.force_armed_failure_calls(
            pathlib.Path(dc.__file__)),
    }


# ------------------------------------------------------------------ requests

_FINISH = {
    None: lambda: None,
    "abort": lambda: sb.FINISH_ABORT("reqmodel: abort"),
    "length": lambda: sb.FINISH_LENGTH(length=0),
}


def kind(reason) -> Optional[str]:
    if reason is None:
        return None
    if isinstance(reason, sb.FINISH_ABORT):
        return "abort"
    if isinstance(reason, sb.FINISH_LENGTH):
        return "length"
    return type(reason).__name__


def make_req(rid: str, tokens: int, room: int, host: str = du.FAKE_BOOTSTRAP_HOST) -> "sb.Req":
    """A request of ``tokens`` prompt tokens on ``room``; the fake bootstrap
    host unless a seam needs the real transport's checks (``_is_fake_transfer``
    skips the metadata gate and the room check)."""
    req = sb.Req(rid, "", array("q", range(1, tokens + 1)), SamplingParams(max_new_tokens=8),
                 bootstrap_host=host, bootstrap_port=BOOTSTRAP_PORT,
                 bootstrap_room=room)
    req.time_stats = mock.MagicMock()
    return req


def shape(req, spec: Dict[str, Any]) -> None:
    """Give a real Req the model's record: finish fields and resource markers,
    set where the real code keeps them."""
    if spec.get("to_finish"):
        req.to_finish = _FINISH[spec["to_finish"]]()
    if spec.get("finished_reason"):
        req.finished_reason = _FINISH[spec["finished_reason"]]()
    if spec.get("is_retracted"):
        req.is_retracted = True
    if spec.get("holds_kv"):
        req.kv.req_pool_idx = 0
    if spec.get("holds_metadata"):
        req.metadata_buffer_index = 0
    if spec.get("retraction_backup"):
        req.kv.retraction_backup = object()


# ----------------------------------------------------------------- schedulers

class Spy:
    def __init__(self, wraps=None):
        self.calls = 0
        self.wraps = wraps

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.wraps is not None:
            return self.wraps(*args, **kwargs)


class ReleaseSpy(Spy):
    """``release_kv_cache(req, tree_cache, ...)``: counts calls and marks the
    request's KV released, as the real one leaves it (``reset_for_retract``
    asserts it)."""

    def __call__(self, req, *args, **kwargs):
        self.calls += 1
        req.kv.req_pool_idx = None
        for name in ("kv_allocated_len", "max_evicted_seqlen"):
            try:
                setattr(req.kv, name, 0)
            except AttributeError:  # a derived property in some releases
                pass


class StreamSpy(Spy):
    """``stream_output(reqs, ...)``: counts requests streamed (the inflight
    queue calls it with an empty list when nothing finished)."""

    def __call__(self, reqs, *args, **kwargs):
        self.calls += len(reqs)


def collaborators(s):
    """What both scheduler stand-ins hold: the stream spy, mocks for the tree
    cache, beam coordinator and metrics, the one-rank groups, and the real
    ``_release_aborted_request`` where the release has it (0.5.20+: the
    tree cache's ``finish``, from 0.5.22 the streaming session's
    ``abort_req``)."""
    s.output_streamer = types.SimpleNamespace(stream_output=StreamSpy())
    s.tree_cache = mock.MagicMock()
    s.beam_coordinator = mock.MagicMock()
    s.metrics_reporter = mock.MagicMock()
    s.metrics_collector = mock.MagicMock()
    real = getattr(sch.Scheduler, "_release_aborted_request", None)
    s._release_aborted_request = (mock.MagicMock() if real is None
                                  else (lambda req: real(s, req)))
    s.enable_metrics = False
    s.scheduler_stage_metrics = None
    s.processed_tokens_counter = 0
    s.token_to_kv_pool_allocator = types.SimpleNamespace(page_size=1)
    s.attn_cp_cpu_group = s.attn_tp_cpu_group = s.tp_cpu_group = _GROUP
    return s


def door_scheduler():
    """The scheduler the doors see: a namespace with spies and mocks, and the
    real unbound ``retire_unadmitted_request`` where the release has it."""
    s = collaborators(types.SimpleNamespace())
    s.enable_hisparse = False
    real = getattr(sch.Scheduler, "retire_unadmitted_request", None)
    s.retire_unadmitted_request = Spy(
        None if real is None else (lambda req: real(s, req)))
    return s


def prefill_queue(s, pool_tokens: int, limit_tokens: int, buffers: int):
    q = object.__new__(pf.PrefillBootstrapQueue)
    q.scheduler = s
    q.queue = []
    q.kv_manager = None
    q.transfer_backend = du.TransferBackend.FAKE
    q.max_total_num_tokens = pool_tokens
    q.max_input_len = limit_tokens  # read by the capacity check where it exists
    q.req_to_metadata_buffer_idx_allocator = du.ReqToMetadataIdxAllocator(buffers)
    q.token_to_kv_pool = None
    q.bootstrap_port = BOOTSTRAP_PORT
    q.scheduler_stage_metrics = None
    q.gloo_group = _GROUP
    q.tp_rank, q.tp_size, q.pp_rank, q.pp_size = 0, 1, 0, 1
    return q


def decode_queue(s, buffers: int):
    q = object.__new__(dc.DecodePreallocQueue)
    q.scheduler = s
    q.queue = []
    q.retracted_queue = []
    q.pending_reqs = []
    # what __init__ sets for the fetch of a prefill's parallel info (dc
    # 19:373-376 ... 23:440-443)
    q._ensure_retry_count, q._ensure_last_attempt_time = {}, {}
    q._max_ensure_retries, q._ensure_retry_interval = 15, 1.0
    q.kv_manager = types.SimpleNamespace(prefill_info_table={})
    q.transfer_backend = du.TransferBackend.FAKE
    q.req_to_metadata_buffer_idx_allocator = du.ReqToMetadataIdxAllocator(buffers)
    q.token_to_kv_pool_allocator = types.SimpleNamespace(page_size=1)
    q.token_to_kv_pool = None
    q.bootstrap_port = BOOTSTRAP_PORT
    q.scheduler_stage_metrics = None
    q.gloo_group = _GROUP
    q.tp_rank, q.tp_size, q.pp_rank, q.pp_size = 0, 1, 0, 1
    q.tree_cache = mock.MagicMock()
    q._check_if_req_exceed_kv_capacity = lambda req: False
    return q


# ---------------------------------------------------------------------- seams

def intake(case: Dict[str, Any]) -> Dict[str, Any]:
    """``validate_input_length`` and, on an error, ``set_finish_with_abort``:
    the three lines of ``handle_generate_request`` that glue them (sch
    19:2850-2853, 21:3033-3041) are the only code written here."""
    req = make_req("r", case["req"]["tokens"], 1)
    err = mu.validate_input_length(req, case["limit_tokens"], case["auto_truncate"])
    if err:
        req.set_finish_with_abort(err)
    return {"tokens": len(req.origin_input_ids), "to_finish": kind(req.to_finish),
            "finished_reason": kind(req.finished_reason)}


def prefill_door(case: Dict[str, Any]) -> Dict[str, Any]:
    s = door_scheduler()
    q = prefill_queue(s, case["pool_tokens"], case["limit_tokens"], case["buffers"])
    req = make_req("r", case["req"]["tokens"], 1)
    shape(req, case["req"])
    q.add(req, 1)
    return {"queued": req in q.queue, "sender": req.disagg_kv_sender is not None,
            "retired": s.retire_unadmitted_request.calls,
            "streamed": s.output_streamer.stream_output.calls,
            "to_finish": kind(req.to_finish), "finished_reason": kind(req.finished_reason)}


def decode_door(case: Dict[str, Any]) -> Dict[str, Any]:
    s = door_scheduler()
    q = decode_queue(s, case["buffers"])
    req = make_req("r", case["req"]["tokens"], 1)
    shape(req, case["req"])
    q.add(req, is_retracted=case["is_retracted"], is_rebootstrap=case["is_rebootstrap"])
    entry = next((d for d in q.queue if d.req is req), None)
    return {"queued": entry is not None, "retracted_queue": req in q.retracted_queue,
            "receiver": entry is not None and entry.kv_receiver is not None,
            "retired": s.retire_unadmitted_request.calls,
            "streamed": s.output_streamer.stream_output.calls,
            "to_finish": kind(req.to_finish), "finished_reason": kind(req.finished_reason)}


class _ResultScheduler(pf.SchedulerDisaggregationPrefillMixin):
    """The result side: an empty subclass of the real prefill mixin."""


def result_scheduler(buffers: int):
    """The result side: the real mixin on an empty subclass, with the
    inflight, waiting and bootstrap queues (one metadata allocator, as in the
    scheduler) and spies for what leaves the process."""
    s = collaborators(_ResultScheduler())
    s.disagg_prefill_inflight_queue = []
    s.disagg_prefill_pending_chunk_rids = set()
    s.waiting_queue = []
    s.enable_overlap = False
    s.chunked_req = None
    s.enable_hicache_storage = False
    s.spec_algorithm = types.SimpleNamespace(is_eagle=lambda: False)
    s.batch_result_processor = mock.MagicMock()
    s.server_args = mock.MagicMock()
    s.attn_tp_group = s.tp_group = mock.MagicMock()
    s.ps = _PARALLEL
    s.maybe_send_health_check_signal = lambda: None
    s.req_to_metadata_buffer_idx_allocator = du.ReqToMetadataIdxAllocator(buffers)
    s.disagg_prefill_bootstrap_queue = prefill_queue(door_scheduler(), 1 << 20, 1 << 20, 1)
    s.disagg_prefill_bootstrap_queue.req_to_metadata_buffer_idx_allocator = \
        s.req_to_metadata_buffer_idx_allocator
    s.sends = Spy()
    s.send_kv_chunk = lambda r, last_chunk=False, **kw: s.sends(last_chunk)
    return s


def result_req(s, spec: Dict[str, Any], sender: bool):
    """A request in the result side's state: the model's record, a metadata
    buffer taken from the scheduler's allocator if it holds one, and a real
    ``FakeKVSender`` created by the real door (or none)."""
    req = make_req("r", spec["tokens"], 1)
    if sender:
        s.disagg_prefill_bootstrap_queue.create_sender(req, 1)
    shape(req, dict(spec, holds_metadata=False))
    if spec.get("holds_metadata"):
        req.metadata_buffer_index = s.req_to_metadata_buffer_idx_allocator.alloc()
    req.pending_bootstrap = spec["pending_bootstrap"]
    return req


def prefill_result(case: Dict[str, Any]) -> Dict[str, Any]:
    """P5 ``process_batch_result_disagg_prefill`` on the request's final
    chunk (``inflight_middle_chunks == 0``) or a middle one: real mixin, real
    ``_retire_aborted_prefill_result`` and ``maybe_release_metadata_buffer``
    where the release has them; ``send_kv_chunk``, ``release_kv_cache`` and
    the cache hook (``maybe_cache_unfinished_req``, or the mixin's
    ``checkpoint_disagg_prefill`` where it replaced it) are spies."""
    import torch
    from sglang.srt.managers.utils import GenerationBatchResult
    s = result_scheduler(case["buffers"])
    alloc = s.req_to_metadata_buffer_idx_allocator
    req = result_req(s, case["req"], sender=False)
    req.disagg_kv_sender = mock.MagicMock() if case["req"]["sender"] else None
    released, cached = ReleaseSpy(), Spy()
    patches = [mock.patch.object(pf, "release_kv_cache", released)]
    if hasattr(pf, "maybe_cache_unfinished_req"):
        patches.append(mock.patch.object(pf, "maybe_cache_unfinished_req", cached))
    if hasattr(pf.SchedulerDisaggregationPrefillMixin, "checkpoint_disagg_prefill"):
        s.checkpoint_disagg_prefill = cached
    # a middle chunk's result: chunks still due, the overlap loop (which
    # sends middle chunks from here), whether the next chunk was launched,
    # and the attempts optimistic_release_and_requeue reads
    middle = case.get("middle_chunks", 0)
    req.inflight_middle_chunks = middle
    if middle:
        s.enable_overlap = True
        s.chunked_req = req if case["still_chunking"] else None
        req.extend_range = None
        req.tmp_end_idx = case["end_tokens"]
        req.prefill_attempt_count = case["attempts_used"]
        if hasattr(pf, "get_disagg"):
            patches.append(mock.patch.object(
                pf, "get_disagg", _with_attempts(pf.get_disagg(), case["attempts"])))
    free_before = alloc.available_size()
    batch = mock.MagicMock()
    batch.reqs, batch.spec_info, batch.return_logprob = [req], None, False
    result = GenerationBatchResult(next_token_ids=torch.tensor([11]))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        s.process_batch_result_disagg_prefill(batch, result)
    sender = req.disagg_kv_sender
    if middle:
        out = {"requeued": ("waiting" if req in s.waiting_queue else "bootstrap"
                            if req in s.disagg_prefill_bootstrap_queue.queue else None),
               "pending_bootstrap": bool(req.pending_bootstrap),
               "is_retracted": bool(req.is_retracted)}
    else:
        out = {"cached": cached.calls}
    return {**out, "inflight": req in s.disagg_prefill_inflight_queue, "sent": s.sends.calls,
            "sender_aborted": 0 if sender is None else sender.abort.call_count,
            "kv_released": released.calls,
            "buffer_freed": alloc.available_size() - free_before,
            "streamed": s.output_streamer.stream_output.calls,
            "to_finish": kind(req.to_finish), "finished_reason": kind(req.finished_reason)}


def _with_attempts(real, attempts: int):
    """``get_disagg`` with ``optimistic_prefill_attempts`` set from the scenario."""
    class Disagg:
        optimistic_prefill_attempts = attempts

        def __getattr__(self, name):
            return getattr(real, name)
    return lambda: Disagg()


def prefill_inflight(case: Dict[str, Any]) -> Dict[str, Any]:
    """P6 ``process_disagg_prefill_inflight_queue`` for a request whose
    sender has concluded (``Success`` or ``Failed``): real mixin, real poll
    over the one-rank gloo group, a real ``FakeKVSender`` created by the
    prefill door and latched to the concluded state; ``release_kv_cache`` and
    the tree cache are spies."""
    s = result_scheduler(case["buffers"])
    alloc = s.req_to_metadata_buffer_idx_allocator
    req = result_req(s, case["req"], sender=True)
    from sglang.srt.disaggregation.base import KVPoll
    sender = req.disagg_kv_sender
    if case["poll"] != "WaitingForInput":  # a fresh fake sender polls WaitingForInput
        sender.conclude_state = getattr(KVPoll, case["poll"])
    init = Spy(wraps=sender.init)
    sender.init = init
    released = ReleaseSpy()
    # the parked branch checkpoints the request after finalize from 0.5.21 on
    # (a cache-tree effect the model does not track; notes/conformance.md)
    s.cache_unfinished_disagg_prefill = s.checkpoint_disagg_prefill = Spy()
    s.disagg_prefill_inflight_queue = [req]
    free_before = alloc.available_size()
    with mock.patch.object(pf, "release_kv_cache", released):
        s.process_disagg_prefill_inflight_queue()
    return {"left_queue": req not in s.disagg_prefill_inflight_queue,
            "kv_released": released.calls, "buffer_freed": alloc.available_size() - free_before,
            "streamed": s.output_streamer.stream_output.calls,
            "sender_init": init.calls, "sent": s.sends.calls,
            "pending_bootstrap": bool(req.pending_bootstrap),
            "to_finish": kind(req.to_finish), "finished_reason": kind(req.finished_reason)}


# ------------------------------------------------- decode's room bookkeeping

_ROOM = 7
_ADDR = "prefill:8998"


def room_manager():
    """Decode's ``CommonKVManager`` without its constructor (which opens ZMQ
    sockets, a transfer engine and threads): the bookkeeping fields its
    ``update_status``, ``check_status`` and the receivers' ``__init__``,
    ``clear`` and ``poll`` read, with decode's defaults (no
    ``prefill_complete`` allocation policy, no PP consensus store)."""
    import collections
    import threading
    from sglang.srt.disaggregation.common import conn as cc
    mgr = object.__new__(cc.CommonKVManager)
    mgr.request_status = {}
    mgr.failure_records = {}
    mgr.failure_lock = threading.Lock()
    mgr.addr_to_rooms_tracker = collections.defaultdict(set)
    mgr.required_prefill_response_num_table = {}
    mgr.prefill_response_tracker = collections.defaultdict(set)
    mgr._deferred_ack_targets = {}
    mgr._deferred_ack_poisoned_rooms = set()
    mgr._staging_outstanding = collections.defaultdict(int)
    mgr._deferred_abort_ack_tracker = {}
    mgr.deferred_bootstrap = None
    mgr.defer_decode_allocation = False
    mgr.enable_deferred_decode_kv_release = False
    mgr.waiting_timeout = 300.0
    return mgr


def room_receiver(mgr):
    """The Mooncake receiver of room ``_ROOM``, built by the real
    ``CommonKVReceiver.__init__`` (``update_status(room, Bootstrapping)``);
    its own constructor would contact the bootstrap server."""
    return room_receiver_on(mgr, _ROOM)


def room_receiver_on(mgr, room: int):
    from sglang.srt.disaggregation.common import conn as cc
    from sglang.srt.disaggregation.mooncake import conn as mc
    recv = object.__new__(mc.MooncakeKVReceiver)
    cc.CommonKVReceiver.__init__(recv, mgr, _ADDR, room)
    return recv


def decode_room(case: Dict[str, Any]) -> Dict[str, Any]:
    """One operation on decode's ``request_status[room]`` entry, from the prior
    entry ``case["prior"]`` (a KVPoll name, or None for no entry):
    ``init`` (a new receiver of the room: its ``__init__``, then the
    ``update_status(room, WaitingForInput)`` that ends ``init()``, whose
    bootstrap-server lookups are not run), ``report`` (a prefill status
    applied by the KV manager thread: ``update_status(room, status)``),
    ``clear`` and ``poll`` (an existing, not yet concluded receiver's)."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    mgr = room_manager()
    recv = room_receiver(mgr) if case["op"] in ("clear", "poll") else None
    mgr.request_status.pop(_ROOM, None)
    if case["prior"] is not None:
        mgr.request_status[_ROOM] = getattr(KVPoll, case["prior"])
    out: Dict[str, Any] = {}
    if case["op"] == "init":
        room_receiver(mgr)
        mgr.update_status(_ROOM, KVPoll.WaitingForInput)
    elif case["op"] == "report":
        mgr.update_status(_ROOM, getattr(KVPoll, case["status"]))
    elif case["op"] == "clear":
        recv.clear()
    elif case["op"] == "poll":
        try:
            out["poll"] = kvadapter.poll_name(recv.poll())
        except KeyError:
            out["poll"] = "KeyError"
    status = mgr.request_status.get(_ROOM)
    out["status"] = kvadapter.poll_name(status)
    return out


# ------------------------------------------------------- decode's commit (D3)

_LAYOUT_SIGNATURE = 77


class _SocketSpy:
    def __init__(self):
        self.frames = []

    def send_multipart(self, frames, *args, **kwargs):
        self.frames.append(list(frames))


def _to_socket(sock: _SocketSpy):
    """Receivers reach the prefill bootstrap servers through ``sock``: what
    they send (ABORTs, metadata) is kept there."""
    return mock.patch.object(kvadapter.mc.MooncakeKVReceiver, "_connect_to_bootstrap_server",
                             lambda self, info: (sock, contextlib.nullcontext()), create=True)


def _bootstrap_infos(pranks: int):
    """A receiver's ``bootstrap_infos``: one prefill rank each."""
    return [{"rank_ip": f"10.1.0.{p + 1}", "rank_port": 9000 + p, "is_dummy": False}
            for p in range(pranks)]


def metadata_buffers(size: int):
    """Real ``MetadataBuffers`` of ``size`` slots, small rows, with the KV
    checksum column where the release has one."""
    import torch
    params = inspect.signature(du.MetadataBuffers.__init__).parameters
    kw = {"size": size, "hidden_size": 4, "hidden_states_dtype": torch.float32,
          "max_sampling_mask_tokens": 4}
    if "kv_checksum_enabled" in params:
        kw["kv_checksum_enabled"] = True
    return du.MetadataBuffers(**kw)


def transfer_queue(s, buffers: int, deferred: bool):
    q = object.__new__(dc.DecodeTransferQueue)
    q.scheduler = s
    q.queue = []
    q.gloo_group = _GROUP
    q.tp_rank = 0
    q.req_to_metadata_buffer_idx_allocator = du.ReqToMetadataIdxAllocator(buffers)
    q.metadata_buffers = metadata_buffers(buffers)
    q.tree_cache = mock.MagicMock()
    q.spec_algorithm = s.spec_algorithm
    q.enable_staging = False
    q.staging_handler = None
    q.enable_host_receive = False
    q.enable_deferred_kv_release = deferred
    q.deferred_kv_release_timeout = 30.0
    q._deferred_releases = []
    return q


def decode_commit(case: Dict[str, Any]) -> Dict[str, Any]:
    """D3 ``DecodeTransferQueue.pop_transferred`` on one entry whose receiver
    polls Success or Failed, then ``resolve_deferred_releases``: the real
    queue, the real metadata gate and ``_commit_transfer_to_req`` (room
    check, checksum read) on real ``MetadataBuffers``, a real
    ``MooncakeKVReceiver`` on decode's KV manager (its ``poll``,
    ``failure_exception``, ``ensure_abort_notified`` with the ABORT frames
    caught at the socket), and the real deferred-release queue.
    ``release_kv_cache`` is a spy."""
    s, q, mgr, recv, req, dreq, KVPoll = _transfer_entry(case, case["deferred"])
    s.kv_checksum_computer = object() if case["checksum"] else None
    recv.abort_notified = case["notified"]
    recv.conclude_state = None if case["latched"] is None else getattr(KVPoll, case["latched"])
    alloc = q.req_to_metadata_buffer_idx_allocator
    idx = dreq.metadata_buffer_index
    room = {"own": kvadapter.ROOM, "none": 0, "other": kvadapter.ROOM + 1}[case["slot_room"]]
    q.metadata_buffers.bootstrap_room[idx, 0] = room
    if case["slot_checksum"] and getattr(q.metadata_buffers, "kv_checksum", None) is not None:
        # a digest written by a prefill with this decode's layout (the cases
        # have matching layouts): 0.5.23 keeps it only when the slot's layout
        # signature is decode's own (_kv_checksum_comparable, dc 23:2580-2598)
        q.metadata_buffers.kv_checksum[idx, 0] = 12345
        if q.metadata_buffers.kv_checksum.shape[1] > 1:
            q.metadata_buffers.kv_checksum[idx, 1] = _LAYOUT_SIGNATURE
    q.queue = [dreq]
    sock = _SocketSpy()
    released = ReleaseSpy()
    free_before = alloc.available_size()
    with mock.patch.object(dc, "release_kv_cache", released), _to_socket(sock):
        done = q.pop_transferred()
        q.resolve_deferred_releases()
    expected = getattr(req, "expected_kv_checksum", None)
    return {"transferred": req in done, "held": any(d.req is req for d, *_ in q._deferred_releases),
            "kv_released": released.calls, "buffer_freed": alloc.available_size() - free_before,
            "streamed": s.output_streamer.stream_output.calls,
            "receiver_cleared": kvadapter.ROOM not in mgr.request_status,
            "abort_sent": sum(1 for f in sock.frames if f and f[0] == b"ABORT"),
            "armed": kvadapter.ROOM in mgr._deferred_abort_ack_tracker,
            "checksum": expected not in (None, 0, (0, 0)),
            "to_finish": kind(req.to_finish), "finished_reason": kind(req.finished_reason)}


def _transfer_entry(case: Dict[str, Any], deferred: bool = True):
    """Decode's transfer queue, its KV manager seeded with the room's entry
    and drain-ack tracker, and a receiver of the room (metadata published,
    one bootstrap info per prefill rank) on a request that holds a metadata
    slot and KV pages."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    s = door_scheduler()
    s.enable_decode_hicache = False
    s.metrics_reporter = types.SimpleNamespace(enable_metrics=False)
    s.batch_result_processor = mock.MagicMock()
    s.spec_algorithm = types.SimpleNamespace(is_none=lambda: True, is_eagle=lambda: False)
    s.disagg_decode_prealloc_queue = types.SimpleNamespace(
        kv_checksum_signature=_LAYOUT_SIGNATURE)
    q = transfer_queue(s, case["buffers"], deferred)
    q._skipped_checksum_signatures = set()
    mgr = kvadapter.manager(0, deferred)
    recv = room_receiver_on(mgr, kvadapter.ROOM)
    mgr.request_status.pop(kvadapter.ROOM, None)
    kvadapter.seed_decode(mgr, {"status": case["status"], "responded": [],
                         "tracker": case["tracker"]}, case["pranks"],
                   (case["tracker"] or {"gen": 0})["gen"] + 1)
    recv.bootstrap_infos = _bootstrap_infos(case["pranks"])
    recv.init_time = 1.0
    req = make_req("r", case["req"]["tokens"], kvadapter.ROOM, host="10.1.0.1")
    shape(req, case["req"])
    idx = q.req_to_metadata_buffer_idx_allocator.alloc()
    dreq = dc.DecodeRequest(req=req, kv_receiver=recv, metadata_buffer_index=idx)
    return s, q, mgr, recv, req, dreq, KVPoll


class _Collective:
    """``all_reduce_flags`` over the decode ranks of one case, run as threads
    of this process: each rank's real ``resolve_deferred_releases`` calls it
    with its own flags and gets the element-wise MIN of every rank's (the
    gloo all-reduce, replaced at its boundary like the sockets)."""

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties)
        self.flags: Dict[int, list] = {}

    def __call__(self, flags, group, op):
        rank = threading.current_thread().rank
        self.flags[rank] = list(flags)
        self.barrier.wait()
        out = [min(col) for col in zip(*self.flags.values())]
        self.barrier.wait()
        return out


def deferred_release(case: Dict[str, Any]) -> Dict[str, Any]:
    """``resolve_deferred_releases`` on every decode rank that holds the
    request for its drain ack: per rank, the real deferred-release list (its
    entry made by the real ``_defer_release``, before or after its deadline),
    the real ``is_abort_release_safe`` on the rank's seeded tracker, the real
    ``_do_release`` (``clear_deferred_abort_state``, the receiver's
    ``clear()``, the metadata slot freed); ``release_kv_cache`` is a spy.  The
    ranks run as threads, so 0.5.23's MIN-reduce of readiness across ranks
    (``all_reduce_flags``) is the real call on every rank (``_Collective``)."""
    ranks = []
    for k, tracker in enumerate(case["trackers"]):
        # a rank that already let go (up to 0.5.22 a rank releases alone)
        # cleared its own room entry and tracker in its _do_release
        kept = k in case["held"]
        _, q, mgr, recv, req, dreq, KVPoll = _transfer_entry(
            dict(case, tracker=tracker if kept else None,
                 status=case["status"] if kept else None))
        recv.conclude_state = KVPoll.Failed
        recv.abort_notified = True
        if case["expired"]:
            q.deferred_kv_release_timeout = -1.0  # the deadline has passed
        if kept:
            q._defer_release(dreq)
        ranks.append((q, mgr, dreq, q.req_to_metadata_buffer_idx_allocator.available_size(),
                      ReleaseSpy()))
    errors = []

    def resolve(q):
        try:
            q.resolve_deferred_releases()
        except Exception as e:  # reported as the case's error below
            errors.append(e)
    threads = []
    for k, (q, *_) in enumerate(ranks):
        t = threading.Thread(target=resolve, args=(q,))
        t.rank = k
        threads.append(t)

    def release_kv_cache(req, *args, **kwargs):  # the calling rank's spy
        ranks[threading.current_thread().rank][4](req, *args, **kwargs)
    patch = (mock.patch.object(dc, "all_reduce_flags", _Collective(len(case["held"])))
             if hasattr(dc, "all_reduce_flags") else contextlib.nullcontext())
    with patch, mock.patch.object(dc, "release_kv_cache", release_kv_cache):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    if errors:
        raise errors[0]
    out = []
    for q, mgr, dreq, free_before, released in ranks:
        out.append({"held": any(e[0] is dreq for e in q._deferred_releases),
                    "kv_released": released.calls,
                    "buffer_freed": q.req_to_metadata_buffer_idx_allocator.available_size()
                    - free_before})
    if not any(r["held"] for r in out):
        for got, (_, mgr, _, _, _) in zip(out, ranks):
            got.update(status=kvadapter.poll_name(mgr.request_status.get(kvadapter.ROOM)),
                       tracker=kvadapter.ROOM in mgr._deferred_abort_ack_tracker)
    return {"ranks": out}


# -------------------------------------------------- decode's prealloc scan (D2)

_PAGE = 16  # tokens per page, as cases.PAGE


def _prealloc_pools(q, case: Dict[str, Any]) -> None:
    """Real pools behind the queue: a ``ReqToTokenPool`` and a paged
    ``PagedTokenToKVPoolAllocator`` of the model's page size whose free list
    holds exactly the model's free pages (model page ``p`` is the real page
    ``p + 1``: page 0 is the allocators' padding page), and a metadata
    allocator whose free deque holds the model's free slots."""
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    n = len(case["entries"])
    q.req_to_token_pool = ReqToTokenPool(size=n + 1, max_context_len=(case["pool_pages"] + 1) * _PAGE,
                                         device="cpu", enable_memory_saver=False)
    alloc = PagedTokenToKVPoolAllocator(size=case["pool_pages"] * _PAGE, page_size=_PAGE,
                                        dtype=torch.float32, device="cpu", kvcache=None,
                                        need_sort=False)
    alloc.free_pages = torch.tensor([p + 1 for p in case["free_pages"]], dtype=torch.int64)
    q.token_to_kv_pool_allocator = alloc
    slots = q.req_to_metadata_buffer_idx_allocator
    slots.free_slots = collections.deque(case["free_slots"])


class _NaiveExtend:
    """``alloc_extend_kernel[(bs,)](...)`` of releases whose paged allocator
    always launches the triton kernel (0.5.19-0.5.22): runs the wheel's own
    ``alloc_extend_naive``, the reference the NPU allocator and, from 0.5.23,
    the paged allocator itself use where triton is missing."""

    def __getitem__(self, grid):
        from sglang.srt.mem_cache.allocator import paged

        def launch(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _bs_pow2,
                   page_size):
            paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages,
                                     out_indices, page_size, out_indices.device)
        return launch


def prealloc_scheduler():
    """The decode scheduler the prealloc scan reads: empty running batch and
    waiting queue, no priority scheduling, hicache, LoRA or radix cache."""
    s = door_scheduler()
    s.running_batch = types.SimpleNamespace(reqs=[])
    s.waiting_queue = []
    s.last_batch = None
    s.enable_priority_scheduling = False
    s.enable_decode_hicache = False
    s.enable_lora = False
    s.server_args = types.SimpleNamespace(disaggregation_decode_enable_radix_cache=False)
    return s


def decode_prealloc(case: Dict[str, Any]) -> Dict[str, Any]:
    """D2 ``DecodePreallocQueue.pop_preallocated`` on the whole prealloc
    queue of one decode rank: the real handshake poll
    (``_update_handshake_waiters`` over a one-rank gloo group), the abort
    scan, the real budget helpers (retracted requests reserved), ``_pre_alloc``
    on a real request pool and paged allocator, the metadata slot, and
    ``send_metadata`` of real ``MooncakeKVReceiver``s on decode's KV manager,
    whose frames are caught at the socket.  ``entries[0]`` is the request the
    case is about; rooms are labels (``"0"``, ``"1"``...) for real rooms."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.mem_cache.allocator import paged
    s = prealloc_scheduler()
    q = decode_queue(s, case["buffers"])
    _prealloc_pools(q, case)
    q.num_reserved_decode_tokens = 0  # --num-reserved-decode-tokens 0
    q._prefill_dp_rank_queries = {}
    q.held_rebootstrap_reqs = []
    q.enable_staging = False
    q.draft_token_to_kv_pool = None
    q.transfer_queue = types.SimpleNamespace(queue=[], enable_staging=False)
    q._num_published_destinations = 0
    q.retracted_queue = [make_req(f"t{i}", n, 100 + i) for i, n in enumerate(case["retracted"])]
    mgr = kvadapter.manager(0, False)
    mgr.kv_args = types.SimpleNamespace(state_types=[])
    mgr.waiting_timeout = 300.0
    q.kv_manager = mgr
    room_of = lambda label: kvadapter.ROOM + int(label)  # noqa: E731
    sock = _SocketSpy()
    dreqs = []
    for i, e in enumerate(case["entries"]):
        recv = room_receiver_on(mgr, room_of(e["room"]))
        recv.bootstrap_infos = _bootstrap_infos(case["pranks"])
        recv.session_id = "decode-session"
        recv.required_dst_info_num = 1
        recv.init_time = time.time()
        if e["latched"] is not None:
            recv.conclude_state = getattr(KVPoll, e["latched"])
        req = make_req(f"r{i}", e["tokens"], room_of(e["room"]), host="10.1.0.1")
        shape(req, e)
        dreq = dc.DecodeRequest(req=req, kv_receiver=recv)
        dreq.waiting_for_input = e["waiting"]
        dreqs.append(dreq)
    for label, status in case["rooms"].items():
        mgr.request_status.pop(room_of(label), None)
        if status is not None:
            mgr.request_status[room_of(label)] = getattr(KVPoll, status)
    q.queue = list(dreqs)
    slots_before = set(q.req_to_metadata_buffer_idx_allocator.free_slots)
    free_before = set(case["free_pages"])
    naive = (contextlib.nullcontext() if hasattr(q.token_to_kv_pool_allocator, "use_triton_kernels")
             else mock.patch.object(paged, "alloc_extend_kernel", _NaiveExtend()))
    try:
        with naive, _to_socket(sock):
            done, failed = q.pop_preallocated()
    except KeyError:  # check_status of a popped room, in the handshake's poll
        return {"crash": "KeyError"}
    except ValueError as e:
        if "Unexpected poll case" not in str(e):
            raise
        return {"crash": "ValueError"}
    focus = dreqs[0]
    out = {"crash": None, "dropped": [i for i, d in enumerate(dreqs) if d in failed],
           "streamed": s.output_streamer.stream_output.calls, "preallocated": focus in done,
           "rooms": {label: kvadapter.poll_name(mgr.request_status.get(room_of(label)))
                     for label in case["rooms"]}}
    if focus in done:
        import numpy as np
        # the focus request's frames: its room, and its own metadata slot (two
        # users of one room, as in n > 1 sampling, each send theirs; a frame
        # naming another slot is then the other user's, and a wrong slot
        # shows as missing frames)
        frames = [f for f in sock.frames if f[0] == str(focus.req.bootstrap_room).encode()
                  and int(f[5]) == focus.metadata_buffer_index]
        pages = [[int(p) - 1 for p in np.frombuffer(f[4], dtype=np.int32)]  # model pages
                 for f in frames]
        out["metadata"] = {
            "frames": len(frames), "pages": len(pages[0]) if pages else 0,
            "pages_were_free": all(p in free_before for ps in pages for p in ps)
            and all(ps == pages[0] and len(set(ps)) == len(ps) for ps in pages),
            "slot_was_free": all(int(f[5]) == focus.metadata_buffer_index for f in frames)
            and focus.metadata_buffer_index in slots_before,
            "prefix": max((int(f[8]) for f in frames), default=0)}
    return out


SEAMS = {"intake": intake, "prefill_door": prefill_door, "decode_door": decode_door,
         "prefill_result": prefill_result, "prefill_inflight": prefill_inflight,
         "decode_room": decode_room, "decode_commit": decode_commit,
         "deferred_release": deferred_release, "decode_prealloc": decode_prealloc}
SEAMS.update(kvadapter.SEAMS)
