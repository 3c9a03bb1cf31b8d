"""Replay a whole counterexample on one released wheel: one set of real
objects that persist across the trace's steps (``reqmodel conform --trace``).

Runs in the conformance worker beside ``adapter.py``.  One prefill rank and
one decode rank, each with its real scheduler parts and Mooncake KV manager:

- prefill: ``PrefillBootstrapQueue`` (its door, ``create_sender`` making real
  ``MooncakeKVSender``s, ``pop_bootstrapped``), the prefill mixin on an empty
  subclass (``process_batch_result_disagg_prefill`` with its real
  ``send_kv_chunk``, ``process_disagg_prefill_inflight_queue``), a real
  ``ReqToTokenPool`` and paged allocator, real ``MetadataBuffers``, and the
  manager's own ``bootstrap_thread`` and ``transfer_worker``;
- decode: ``DecodePreallocQueue`` (door, receivers, ``pop_preallocated`` on
  a real request pool and paged allocator), ``DecodeTransferQueue``
  (``pop_transferred``, the commit, deferred release), real
  ``MetadataBuffers`` and the manager's own ``decode_thread``.

The KV pools are real tensors, one layer of K and V with one int64 per token:
a prefill forward writes ``rid + 1`` into every token row it computes, and
the transfer engine is replaced at its byte boundary by a ``memmove`` of the
ranges Mooncake's real ``send_kvcache`` and ``send_aux`` compute
(``batch_transfer_sync(session, src, dst, lengths)``).  So a decode page
remembers which request wrote it last, because it holds that request's bytes.

Sockets are in-process: what a receiver sends to the prefill bootstrap
server (KV-args registration, metadata, ABORT) lands in prefill's inbox and
what prefill's manager sends to decode (status reports, ABORT_ACKs) lands in
decode's; a step that receives a message runs the release's own thread body
on exactly that message.  The transfer worker is a real thread held at two
gates: ``xfer_dequeue`` lets it take one chunk (its status check runs),
``xfer_write`` lets its engine calls through and waits until it is back at
the queue.

Glue, the only behaviour written here (each a few lines of the scheduler the
seams do not reach): the forward (pages allocated with the real allocator,
rows written), ``waiting_queue.extend(pop_bootstrapped())``,
``transfer_queue.extend(pop_preallocated())``, the prebuilt batch (D4: the
decode forward reads the pages) and the decode step's finish
(``to_finish`` or length, stream, free the pages).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import threading
import time
import types
from typing import Any, Dict, List, Optional
from unittest import mock

import torch

import adapter
import kvadapter
from adapter import dc, du, pf, sb, mu
from kvadapter import mc

PAGE = 16
_ROOM0 = 1000
_P_IP, _P_PORT = "10.1.0.1", 9000
_D_IP, _D_PORT = "10.0.0.1", 17000
_ADDR = f"{_P_IP}:{adapter.BOOTSTRAP_PORT}"
_WAIT = 10.0


class _Closed(BaseException):
    """Ends the transfer worker thread when its replay is over."""


class Diverged(Exception):
    """The real code cannot take the step the trace takes."""


def _kind(reason) -> Optional[str]:
    return adapter.kind(reason)


def _status(reason) -> str:
    """An answer as the client tells it: ``ok`` (200) or ``error``.  The
    HTTP status of an abort whose reason carries none is set past the
    scheduler (tokenizer manager, HTTP server), which the rig does not run;
    the seams compare finishes as kinds for the same reason."""
    return "error" if isinstance(reason, sb.FINISH_ABORT) else "ok"


# ------------------------------------------------------------- the KV pools

class Pool:
    """A real request pool, paged allocator and a one-layer K/V tensor pair
    with one int64 per token row (the row's value: last writer rid + 1)."""

    def __init__(self, pages: int, reqs: int, free_pages: Optional[List[int]] = None):
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        self.pages = pages
        self.req_to_token_pool = ReqToTokenPool(size=reqs + 1, max_context_len=(pages + 1) * PAGE,
                                                device="cpu", enable_memory_saver=False)
        self.allocator = PagedTokenToKVPoolAllocator(size=pages * PAGE, page_size=PAGE,
                                                     dtype=torch.float32, device="cpu",
                                                     kvcache=None, need_sort=False)
        if free_pages is not None:  # model page p is real page p + 1
            self.allocator.free_pages = torch.tensor([p + 1 for p in free_pages],
                                                     dtype=torch.int64)
        self.k = torch.zeros((pages + 1) * PAGE, dtype=torch.int64)
        self.v = torch.zeros((pages + 1) * PAGE, dtype=torch.int64)

    def kv_args(self):
        item = PAGE * self.k.element_size()  # bytes of one page of one layer
        return dict(kv_data_ptrs=[self.k.data_ptr(), self.v.data_ptr()],
                    kv_data_lens=[self.k.nbytes, self.v.nbytes], kv_item_lens=[item, item])

    def pages_at(self, addrs) -> List[int]:
        """The model pages of the K rows at these addresses (others: V rows,
        metadata, ignored)."""
        base, item = self.k.data_ptr(), PAGE * self.k.element_size()
        return sorted({(a - base) // item - 1 for a in addrs
                       if base + item <= a < base + self.k.nbytes})

    def writer(self, model_page: int) -> Optional[int]:
        v = int(self.k[(model_page + 1) * PAGE])
        return None if v == 0 else v - 1

    def model_pages(self, req) -> List[int]:
        idx = req.kv.req_pool_idx if hasattr(req, "kv") else req.req_pool_idx
        if idx is None:
            return []
        n = -(-len(req.origin_input_ids) // PAGE) * PAGE
        rows = self.req_to_token_pool.req_to_token[idx, :n:PAGE]
        return [int(t) // PAGE - 1 for t in rows if int(t) > 0]


def _naive_extend(allocator):
    from sglang.srt.mem_cache.allocator import paged
    if hasattr(allocator, "use_triton_kernels"):
        return contextlib.nullcontext()
    return mock.patch.object(paged, "alloc_extend_kernel", adapter._NaiveExtend())


# --------------------------------------------------------- the transfer gate

class Gate:
    """The prefill transfer worker's queue and engine, as two gates the rig
    opens: ``dequeue`` lets the worker take one chunk, ``write`` lets the
    engine calls of that chunk through."""

    def __init__(self):
        self.cv = threading.Condition()
        self.items: List[Any] = []
        self.permits = 0
        self.open = False
        self.where = "start"  # "get" (waiting at the queue), "engine", "busy"
        self.error: Optional[BaseException] = None
        self.closed = False

    # the queue side, called by the worker thread
    def put(self, item):
        with self.cv:
            self.items.append(item)
            self.cv.notify_all()

    def get(self):
        with self.cv:
            self.where = "get"
            self.cv.notify_all()
            while not (self.permits and self.items) and not self.closed:
                self.cv.wait()
            if self.closed:
                raise _Closed
            self.permits -= 1
            self.where = "busy"
            return self.items.pop(0)

    def empty(self):
        with self.cv:
            return not self.items

    def qsize(self):
        with self.cv:
            return len(self.items)

    # the engine side
    def engine_call(self):
        with self.cv:
            self.where = "engine"
            self.cv.notify_all()
            while not self.open and not self.closed:
                self.cv.wait()
            if self.closed:
                raise _Closed
            self.where = "busy"

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def _wait_for(self, pred):
        deadline = time.monotonic() + _WAIT
        with self.cv:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or self.error is not None:
                    break
                self.cv.wait(left)
        if self.error is not None:
            raise self.error
        if not pred():
            raise RuntimeError(f"the transfer worker did not come back (at {self.where})")

    def dequeue(self):
        with self.cv:
            if not self.items:
                raise Diverged("the transfer queue is empty")
            self.permits += 1
            self.open = False
            self.cv.notify_all()
        self._wait_for(lambda: self.permits == 0 and self.where in ("get", "engine"))

    def at_engine(self) -> bool:
        with self.cv:
            return self.where == "engine"

    def write(self):
        with self.cv:
            self.open = True
            self.cv.notify_all()
        self._wait_for(lambda: self.where == "get")
        with self.cv:
            self.open = False


class Engine:
    """Mooncake's transfer engine at its byte boundary: each block is a
    ``memmove`` between the two processes' (here: one process's) buffers."""

    def __init__(self, gate: Gate):
        self.gate = gate
        self.writes: List[tuple] = []
        self.fail_next = False  # the next batch times out (returns -1) ...
        self.stray: List[tuple] = []  # ... and its blocks land later

    def get_session_id(self):
        return f"{_P_IP}:{_P_PORT}"

    def batch_transfer_sync(self, session_id, src, dst, lengths):
        self.gate.engine_call()
        if self.fail_next:
            # the NIC read the source while the batch ran: the late landing
            # writes those bytes, whatever prefill has put there since
            self.fail_next = False
            self.stray.extend((ctypes.string_at(int(s), int(n)), int(d))
                              for s, d, n in zip(src, dst, lengths))
            return -1
        for s, d, n in zip(src, dst, lengths):
            ctypes.memmove(int(d), int(s), int(n))
            self.writes.append((int(s), int(d), int(n)))
        return 0

    def transfer_sync(self, session_id, src, dst, length):
        return self.batch_transfer_sync(session_id, [src], [dst], [length])


# ------------------------------------------------------------------ managers

def _kv_args(pool: Pool, meta) -> types.SimpleNamespace:
    aux_ptrs, aux_lens, aux_items = meta.get_buf_infos()[:3]
    return types.SimpleNamespace(
        **pool.kv_args(), aux_data_ptrs=aux_ptrs, aux_data_lens=aux_lens,
        aux_item_lens=aux_items, state_data_ptrs=[], state_data_lens=[],
        state_item_lens=[], state_type="none", state_types=[], state_layer_ids=[],
        state_dim_per_tensor=[], kv_layer_ids=[0, 0], prefill_start_layer=0,
        prefill_end_layer=None, mla_compression_ratios=None, engine_rank=0,
        page_size=PAGE, kv_head_num=1, total_kv_head_num=1, ib_device=None,
        gpu_id=0, decode_tp_size=1, prefill_pp_size=1, pp_rank=0, system_dp_rank=0,
        kv_checksum_enabled=False)


def _manager(rank_ip: str, rank_port: int, pool: Pool, meta, engine, deferred: bool,
             mode):
    mgr = kvadapter.manager(0, deferred)
    mgr.local_ip, mgr.rank_port = rank_ip, rank_port
    mgr.kv_args = _kv_args(pool, meta)
    mgr.engine = engine
    mgr.disaggregation_mode = mode
    mgr.is_mla_backend = False
    mgr.is_hybrid_mla_backend = False
    mgr.enable_trace = False
    mgr.enable_custom_mem_pool = False
    mgr.custom_mem_pool_type = None
    mgr.attn_tp_size, mgr.attn_dp_rank, mgr.attn_dp_size = 1, 0, 1
    mgr.dp_size = 1
    mgr.dcp_size, mgr.dcp_rank = 1, 0
    mgr.is_dummy_cp_rank = False
    mgr.enable_all_cp_ranks_for_transfer = False
    mgr.bootstrap_port = adapter.BOOTSTRAP_PORT
    mgr.session_lock = threading.Lock()
    mgr.failed_sessions = set()
    mgr.session_failures = __import__("collections").defaultdict(int)
    mgr.decode_kv_args_table = {}
    mgr.connection_pool = {}
    mgr.connection_lock = threading.Lock()
    mgr.prefill_info_table = {}
    mgr.heartbeat_failures = {}
    mgr.heartbeat_interval = 5.0
    mgr.max_failures = 3
    mgr.bootstrap_timeout = 300.0
    mgr.waiting_timeout = 300.0
    mgr.kv_checksum_enabled = False
    # bookkeeping the constructors of later releases add, at their defaults
    mgr.state_layout_rejections = {}
    mgr.state_strides_validated = set()
    mgr.failed_session_probes = {}
    mgr._dcp_pack_max_tokens = None
    mgr._dcp_pack_buffers = None
    mgr.kv_item_lens_sum = sum(mgr.kv_args.kv_item_lens)
    mgr.state_item_lens_sum = 0
    mgr._kv_replica_factor = 1  # not MLA
    for name, default in (("SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", 30.0),
                          ("SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S", 600.0)):
        flag = getattr(mc.envs, name, None)
        value = default if flag is None else flag.get()
        attr = ("failed_session_probe_interval" if "INTERVAL" in name
                else "failed_session_idle_timeout")
        setattr(mgr, attr, value)
    if hasattr(mc.envs, "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES"):  # 0.5.20+
        mgr.max_transfer_batch_indices = mc.envs.SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES.get()
    return mgr


# ---------------------------------------------------------------- the rig

class Rig:
    """The persistent real objects of one trace replay."""

    def __init__(self, cfg: Dict[str, Any]):
        self.cfg = cfg
        self.n = cfg["n"]
        self.rooms = [_ROOM0 + k for k in cfg["room_of"]]
        self.stack = contextlib.ExitStack()
        self.p_req: List[Any] = [None] * self.n
        self.d_req: List[Any] = [None] * self.n
        # the status of each request's first final stream_output, per side
        self.p_answer: List[Optional[int]] = [None] * self.n
        self.d_answer: List[Optional[int]] = [None] * self.n
        # whether each side's intake rejected the request (validate_input_length)
        self.p_rejected = [False] * self.n
        self.echoed = {"p": set(), "d": set()}
        self.seen_p = [False] * self.n  # the request has been through the door
        self.seen_d = [False] * self.n
        self.crashed = {"p": [False] * self.n, "d": [False] * self.n}
        self.abort_reached = {"p": set(), "d": set()}  # the client's abort reached it
        self.last_commit: Optional[Dict[str, Any]] = None
        # id(frame) -> (frame, the request whose step sent it); the frame is
        # kept so that its id is not reused
        self.sent_by: Dict[int, tuple] = {}  # requests answered by an abort echo
        self.d_rejected = [False] * self.n
        self.d_gone: set = set()
        self.d_retracting: set = set()  # retracted, not yet back at decode's door
        self.p_inbox: List[List[bytes]] = []
        self.d_inbox: List[List[bytes]] = []
        self._prefill(cfg)
        self._decode(cfg)
        self._worker()

    # ---------------------------------------------------------------- setup
    def _stream_spy(self, answers: List[Optional[int]], side: str):
        def stream_output(reqs, *args, **kwargs):
            for req in reqs:
                r = self._rid_of(req, side)
                if r is not None and req.finished() and answers[r] is None:
                    answers[r] = _status(req.finished_reason)
        return types.SimpleNamespace(stream_output=stream_output)

    def _rid_of(self, req, side: str) -> Optional[int]:
        reqs = self.p_req if side == "p" else self.d_req
        return next((r for r, x in enumerate(reqs) if x is req), None)

    def _prefill(self, cfg):
        p = cfg["prefill"]
        self.p_pool = Pool(p["pool_pages"], self.n)
        self.gate = Gate()
        self.engine = Engine(self.gate)
        self.p_meta = adapter.metadata_buffers(p["metadata_buffers"])
        self.p_mgr = _manager(_P_IP, _P_PORT, self.p_pool, self.p_meta, self.engine,
                              cfg["deferred"], du.DisaggregationMode.PREFILL)
        self.p_mgr.transfer_queues = [self.gate]
        s = adapter.result_scheduler(p["metadata_buffers"])
        s.output_streamer = self._stream_spy(self.p_answer, "p")
        s.req_to_token_pool = self.p_pool.req_to_token_pool
        s.token_to_kv_pool_allocator = self.p_pool.allocator
        s.disagg_metadata_buffers = self.p_meta
        s.enable_staging = False
        s.kv_checksum_computer = None  # --disaggregation-enable-kv-checksum off
        s.send_kv_chunk = types.MethodType(pf.SchedulerDisaggregationPrefillMixin.send_kv_chunk, s)
        real = getattr(adapter.sch.Scheduler, "retire_unadmitted_request", None)
        if real is not None:  # the door calls it on its scheduler
            s.retire_unadmitted_request = types.MethodType(real, s)
        q = s.disagg_prefill_bootstrap_queue
        q.scheduler = s
        q.kv_manager = self.p_mgr
        q.transfer_backend = du.TransferBackend.MOONCAKE
        q.max_total_num_tokens = p["pool_pages"] * PAGE  # the allocator's size
        q.max_input_len = (p["intake_limit_pages"] - 1) * PAGE + 2
        q.metadata_buffers = self.p_meta
        q.token_to_kv_pool = types.SimpleNamespace(page_size=PAGE)
        s.waiting_queue = []
        s.last_batch = types.SimpleNamespace(reqs=[])  # launched, result not processed
        s.running_batch = types.SimpleNamespace(reqs=[])
        self._abort_side(s, du.DisaggregationMode.PREFILL, self.p_answer, "p")
        self.p_sched = s

    def _decode(self, cfg):
        d = cfg["decode"]
        self.d_pool = Pool(d["pool_pages"], self.n)
        self.d_meta = adapter.metadata_buffers(d["metadata_buffers"])
        self.d_mgr = _manager(_D_IP, _D_PORT, self.d_pool, self.d_meta, self.engine,
                              cfg["deferred"], du.DisaggregationMode.DECODE)
        self.d_mgr.engine = types.SimpleNamespace(get_session_id=lambda: f"{_D_IP}:{_D_PORT}")
        self.d_mgr.prefill_info_table[_ADDR] = types.SimpleNamespace(
            target_tp_rank=0, target_tp_ranks=[0], target_cp_ranks=[0], target_pp_ranks=[0],
            required_dst_info_num=1, required_prefill_response_num=1, attn_tp_size=1,
            attn_cp_size=1, dp_size=1, pp_size=1, is_dummy=False,
            # 0.5.22+ checks both roles run one policy; the default on both
            decode_allocation_policy=_default_allocation_policy())
        s = adapter.prealloc_scheduler()
        s.output_streamer = self._stream_spy(self.d_answer, "d")
        s.metrics_reporter = types.SimpleNamespace(enable_metrics=False)
        s.batch_result_processor = mock.MagicMock()
        s.spec_algorithm = types.SimpleNamespace(is_none=lambda: True, is_eagle=lambda: False)
        s.kv_checksum_computer = None
        # 0.5.23's resume waits for the forward stream before its restore
        # (dc 23:1082-1087): a GPU stream order, and the rig runs no forward
        s.enable_overlap = False
        tq = adapter.transfer_queue(s, d["metadata_buffers"], cfg["deferred"])
        tq.metadata_buffers = self.d_meta
        tq._skipped_checksum_signatures = set()
        q = adapter.decode_queue(s, d["metadata_buffers"])
        del q._check_if_req_exceed_kv_capacity  # the real check, on the real allocator
        q.transfer_backend = du.TransferBackend.MOONCAKE
        q.kv_manager = self.d_mgr
        q.req_to_token_pool = self.d_pool.req_to_token_pool
        q.token_to_kv_pool_allocator = self.d_pool.allocator
        q.req_to_metadata_buffer_idx_allocator = tq.req_to_metadata_buffer_idx_allocator
        q.metadata_buffers = self.d_meta
        q.max_total_num_tokens = d["pool_pages"] * PAGE
        q.num_reserved_decode_tokens = 0
        q._prefill_dp_rank_queries = {}
        q.held_rebootstrap_reqs = []
        q.enable_staging = False
        q.draft_token_to_kv_pool = None
        q.transfer_queue = tq
        q._num_published_destinations = 0
        q.kv_checksum_signature = adapter._LAYOUT_SIGNATURE
        s.disagg_decode_prealloc_queue = q
        s.disagg_decode_transfer_queue = tq
        s.chunked_req = None
        s.tree_cache = q.tree_cache
        self._abort_side(s, du.DisaggregationMode.DECODE, self.d_answer, "d")
        self.d_sched, self.d_queue, self.t_queue = s, q, tq

    def _abort_side(self, s, mode, answers, side):
        """What the real ``abort_request`` reads on a scheduler: the echo to
        the tokenizer manager is a spy that records the answer."""
        rig = self
        s.disaggregation_mode = mode
        s.ps = adapter._PARALLEL
        s.mm_receiver = None
        s.dllm_config = None
        s.enable_hicache_storage = False
        s.grammar_manager = mock.MagicMock()
        s._pending_chunked_abort_req = None

        def send_output(out, req=None, *a, **k):
            r = rig._rid_of(req, side) if req is not None else None
            if r is not None and answers[r] is None:
                # an abort echo (method 1): the tokenizer manager finishes
                # the request as an abort (tm 19:3203-3209)
                answers[r] = "error"
                rig.echoed[side].add(r)
        s.ipc_channels = types.SimpleNamespace(
            send_to_tokenizer=types.SimpleNamespace(send_output=send_output))
        s.rust_server = None
        s.enable_continuous_input_polling = False
        s.result_queue = []
        for name in ("abort_request", "collect_inflight_reqs", "_collect_inflight_batches",
                     "send_abort_output"):  # the last two from 0.5.22 / 0.5.23
            if hasattr(adapter.sch.Scheduler, name):
                setattr(s, name, types.MethodType(getattr(adapter.sch.Scheduler, name), s))

    def _worker(self):
        executor = concurrent.futures.ThreadPoolExecutor(2)

        def run():
            try:
                self.p_mgr.transfer_worker(self.gate, executor)
            except _Closed:
                pass
            except BaseException as e:  # the worker's RuntimeError, reported at the step
                with self.gate.cv:
                    self.gate.error = e
                    self.gate.cv.notify_all()
        self.worker_thread = threading.Thread(target=run, daemon=True)
        self.worker_thread.start()
        self.gate._wait_for(lambda: self.gate.where == "get")

    # ------------------------------------------------------------ sockets
    def _patches(self):
        rig = self

        class Sock:
            def send_multipart(self, frames, *a, **k):
                rig.p_inbox.append(list(frames))

        sock = Sock()
        info = {"rank_ip": _P_IP, "rank_port": _P_PORT, "is_dummy": False}
        self.stack.enter_context(mock.patch.object(
            mc.MooncakeKVReceiver, "_connect_to_bootstrap_server",
            lambda self, info: (sock, contextlib.nullcontext()), create=True))
        self.stack.enter_context(mock.patch.object(
            mc.MooncakeKVReceiver,
            "_get_bootstrap_info_from_server", lambda self, *a, **k: dict(info), create=True))
        self.p_mgr._send_multipart_locked = (
            lambda endpoint, frames, is_ipv6=False: self.d_inbox.append(list(frames)))
        self.d_mgr._send_multipart_locked = (
            lambda endpoint, frames, is_ipv6=False: self.p_inbox.append(list(frames)))
        if hasattr(mc.MooncakeKVSender, "supports_host_tensor_indices"):
            # 0.5.23 copies the page indices device-to-host into pinned memory
            # behind a CUDA event; on CPU the sender takes the release's own
            # synchronous path for senders without it (the same indices)
            self.stack.enter_context(mock.patch.object(
                mc.MooncakeKVSender, "supports_host_tensor_indices", False))
        self.stack.enter_context(_naive_extend(self.d_pool.allocator))
        self.stack.enter_context(_naive_extend(self.p_pool.allocator))
        self.stack.enter_context(mock.patch.object(pf, "release_kv_cache", self._p_release))
        self.stack.enter_context(mock.patch.object(dc, "release_kv_cache", self._d_release))
        self.stack.enter_context(mock.patch.object(adapter.sch, "release_kv_cache",
                                                   self._either_release))
        if hasattr(pf, "maybe_cache_unfinished_req"):
            self.stack.enter_context(mock.patch.object(pf, "maybe_cache_unfinished_req",
                                                       lambda *a, **k: None))
        self.p_sched.checkpoint_disagg_prefill = lambda *a, **k: None
        self.p_sched.cache_unfinished_disagg_prefill = lambda *a, **k: None

    def _p_release(self, req, *args, **kwargs):
        self._free(self.p_pool, req)

    def _d_release(self, req, *args, **kwargs):
        self._free(self.d_pool, req)

    def _either_release(self, req, *args, **kwargs):
        self._free(self.d_pool if any(x is req for x in self.d_req) else self.p_pool, req)

    @staticmethod
    def _free(pool: Pool, req):
        idx = req.kv.req_pool_idx
        if idx is None:
            return
        n = getattr(req.kv, "kv_allocated_len", None) or 0
        n = n or -(-len(req.origin_input_ids) // PAGE) * PAGE
        rows = pool.req_to_token_pool.req_to_token[idx, :n]
        pages = sorted({int(t) // PAGE for t in rows if int(t) > 0})
        if pages:
            pool.allocator.free(torch.tensor([p * PAGE for p in pages], dtype=torch.int64))
        pool.req_to_token_pool.free(req) if _takes_req(pool) else pool.req_to_token_pool.free(idx)
        req.kv.req_pool_idx = None

    # ---------------------------------------------------------------- steps
    def p_intake(self, r, params):
        req = adapter.make_req(f"r{r}", self.cfg["tokens"][r], self.rooms[r], host=_P_IP)
        p = self.cfg["prefill"]
        err = mu.validate_input_length(req, (p["intake_limit_pages"] - 1) * PAGE + 2,
                                       p["auto_truncate"])
        if err:
            req.set_finish_with_abort(err)
        self.p_req[r] = req
        self.p_rejected[r] = bool(err)

    def d_intake(self, r, params):
        req = adapter.make_req(f"r{r}", self.cfg["tokens"][r], self.rooms[r], host=_P_IP)
        d = self.cfg["decode"]
        err = mu.validate_input_length(req, (d["intake_limit_pages"] - 1) * PAGE + 2,
                                       d["auto_truncate"])
        if err:
            req.set_finish_with_abort(err)
        self.d_req[r] = req
        self.d_rejected[r] = bool(err)

    def p_door(self, r, params):
        self.p_sched.disagg_prefill_bootstrap_queue.add(self.p_req[r], 1)
        self.seen_p[r] = True

    def d_door(self, r, params):
        retracted = r in self.d_retracting
        self.d_retracting.discard(r)
        self.d_queue.add(self.d_req[r], is_retracted=retracted)
        self.seen_d[r] = True

    def d_retract(self, r, params):
        """R1 memory retract on the real request: ``release_req`` frees its
        KV and runs ``reset_for_retract``, without the host copy
        (``offload_kv=False``: the copy needs a real KV cache, which the
        rig's pools are not; ``d_resume`` writes the request's own bytes back
        as the restore would).  ``_add_request_to_queue(is_retracted=True)``
        is the next step, ``d_door``."""
        req = self.d_req[r]
        if req not in self.d_sched.running_batch.reqs:
            raise Diverged("the request is not running on decode")
        self.d_sched.running_batch.reqs.remove(req)
        with mock.patch.object(sb, "release_kv_cache", self._d_release, create=True):
            sb.release_req(req=req, remaing_req_count=0,
                           req_to_token_pool=self.d_pool.req_to_token_pool,
                           token_to_kv_pool_allocator=self.d_pool.allocator,
                           tree_cache=self.d_sched.tree_cache, hisparse_coordinator=None,
                           offload_kv=False)
        self.d_retracting.add(r)

    def d_resume(self, r, params):
        """R5: the real ``resume_retracted_reqs`` (its budgets, ``_pre_alloc``
        on the real allocator, the trace's pages first); its restore of the
        host copy writes the request's own bytes into the new pages."""
        req = self.d_req[r]
        self._choose_pages(self.d_pool, params.get("pages"))
        name = "restore_kv_cache" if hasattr(dc, "restore_kv_cache") else "retraction_restore"

        def restore(req, *args, **kwargs):
            mark = self._rid_of(req, "d") + 1
            for pg in self.d_pool.model_pages(req):
                self.d_pool.k[(pg + 1) * PAGE:(pg + 2) * PAGE] = mark
                self.d_pool.v[(pg + 1) * PAGE:(pg + 2) * PAGE] = mark
        with mock.patch.object(dc, name, restore):
            resumed = self.d_queue.resume_retracted_reqs()
        self.d_sched.waiting_queue.extend(resumed)  # the event loop's glue
        if req not in resumed:
            raise Diverged("resume_retracted_reqs did not resume it")

    def _only(self, queue_owner, attr, match):
        """Run a whole-queue scan on the stepped request alone (the model
        steps requests one at a time); the rest of the queue is kept, in
        order, around it."""
        full = getattr(queue_owner, attr)
        mine = [e for e in full if match(e)]
        if not mine:
            raise Diverged("the request is not in the queue")
        setattr(queue_owner, attr, mine)
        return full, mine

    def _restore(self, queue_owner, attr, full, mine):
        kept = getattr(queue_owner, attr)
        setattr(queue_owner, attr, [e for e in full if e not in mine or e in kept])

    def _prealloc_scan(self, r):
        """Decode's prealloc scan for request r: its first call, the
        handshake, polls the whole queue (as the model's ``d_prealloc``
        does); then ``pop_preallocated`` runs on the request."""
        q = self.d_queue
        req = self.d_req[r]
        q._update_handshake_waiters()
        full, mine = self._only(q, "queue", lambda e: e.req is req)
        try:
            return q.pop_preallocated()
        finally:
            self._restore(q, "queue", full, mine)

    def d_prealloc(self, r, params):
        self._choose_pages(self.d_pool, params.get("pages"))
        done, failed = self._prealloc_scan(r)
        if not done:
            raise Diverged(f"pop_preallocated did not preallocate it ({len(failed)} failed)")
        self.t_queue.extend(done)  # the event loop's glue (dc 19:2693)

    @staticmethod
    def _choose_pages(pool: Pool, pages: Optional[List[int]]):
        """Which free pages an allocation takes is the free list's order,
        a choice the model leaves open and the trace fixes: put the trace's
        pages first, in its order (they must be free in the real pool)."""
        if not pages:
            return
        free = [int(p) for p in pool.allocator.free_pages]
        want = [p + 1 for p in pages]
        if not set(want) <= set(free):
            raise Diverged(f"pages {pages} are not all free in the real pool "
                           f"(free: {sorted(p - 1 for p in free)})")
        pool.allocator.free_pages = torch.tensor(
            want + [p for p in free if p not in want], dtype=torch.int64)

    def _run_thread(self, mgr, start: str, frames: List[List[bytes]]):
        kvadapter._run_thread(mgr, start, frames)

    @staticmethod
    def _find(inbox, match, what: str):
        frame = next((f for f in inbox if match(f)), None)
        if frame is None:
            raise Diverged(f"no {what}")
        return frame

    def _to_prefill(self, frame):
        """Prefill's bootstrap thread receives ``frame``, after the KV-args
        registrations a receiver sent before anything else on its socket."""
        regs = [f for f in self.p_inbox if f[0] == b"None"]
        self.p_inbox = [f for f in self.p_inbox if f is not frame and f not in regs]
        self._run_thread(self.p_mgr, "start_prefill_thread", regs + [frame])

    def _to_decode(self, frame):
        self.d_inbox.remove(frame)
        self._run_thread(self.d_mgr, "start_decode_thread", [frame])

    def p_recv_metadata(self, r, params):
        room = str(self.rooms[r]).encode()
        self._to_prefill(self._find(self.p_inbox, lambda f: f[0] == room,
                                    "metadata of the room reached prefill"))

    def p_pop_bootstrapped(self, r, params):
        q = self.p_sched.disagg_prefill_bootstrap_queue
        req = self.p_req[r]
        full, mine = self._only(q, "queue", lambda e: e is req)
        try:
            got = q.pop_bootstrapped()
        finally:
            self._restore(q, "queue", full, mine)
        self.p_sched.waiting_queue.extend(got)

    def p_forward(self, r, params):
        req = self.p_req[r]
        if req not in self.p_sched.waiting_queue:
            raise Diverged("the request is not in prefill's waiting queue")
        self.p_sched.waiting_queue.remove(req)
        n = len(req.origin_input_ids)
        need = -(-n // PAGE) * PAGE
        pool = self.p_pool
        idx = pool.req_to_token_pool.alloc(1)[0] if _alloc_n(pool) else \
            pool.req_to_token_pool.alloc([req])[0]
        req.kv.req_pool_idx = idx
        locs = pool.allocator.alloc(need)
        if locs is None:
            raise Diverged("prefill's pool has no room for the chunk")
        pool.req_to_token_pool.req_to_token[idx, :need] = locs.to(torch.int32)
        pool.k[locs[:n]] = r + 1
        pool.v[locs[:n]] = r + 1
        # where the scheduler records the range it computed: extend_range
        # up to 0.5.21, extend_end from 0.5.22
        for name, value in (("extend_range", types.SimpleNamespace(start=0, end=n)),
                            ("extend_end", n)):
            try:
                setattr(req, name, value)
            except AttributeError:
                pass
        try:
            req.kv.kv_allocated_len = need
        except AttributeError:
            pass
        self.p_sched.last_batch.reqs.append(req)

    def p_result(self, r, params):
        from sglang.srt.managers.utils import GenerationBatchResult
        req = self.p_req[r]
        if req not in self.p_sched.last_batch.reqs:
            raise Diverged("no forward of the request is due")
        self.p_sched.last_batch.reqs.remove(req)
        req.inflight_middle_chunks = 0
        batch = mock.MagicMock()
        batch.reqs, batch.spec_info, batch.return_logprob = [req], None, False
        result = GenerationBatchResult(next_token_ids=torch.tensor([11]))
        self.p_sched.process_batch_result_disagg_prefill(batch, result)

    def p_inflight(self, r, params):
        s = self.p_sched
        req = self.p_req[r]
        full, mine = self._only(s, "disagg_prefill_inflight_queue", lambda e: e is req)
        try:
            s.process_disagg_prefill_inflight_queue()
        finally:
            self._restore(s, "disagg_prefill_inflight_queue", full, mine)

    def xfer_dequeue(self, r, params):
        self.gate.dequeue()

    def xfer_write(self, r, params):
        self.gate.write()

    def d_recv_status(self, r, params):
        room = str(self.rooms[r]).encode()
        self._to_decode(self._find(self.d_inbox, lambda f: f and f[0] == room,
                                   "status report of the room reached decode"))

    def d_transferred(self, r, params):
        q = self.t_queue
        req = self.d_req[r]
        full, mine = self._only(q, "queue", lambda e: e.req is req)
        # what a commit would rest on, read before the real code frees the
        # slot: the room prefill's aux wrote into the request's metadata
        # slot, and whether each reserved page holds this request's bytes
        idx = mine[0].metadata_buffer_index
        slot_room = None if idx is None or idx < 0 else int(self.d_meta.bootstrap_room[idx, 0])
        covered = all(self.d_pool.writer(pg) == r for pg in self.d_pool.model_pages(req))
        try:
            done = q.pop_transferred()
        finally:
            self._restore(q, "queue", full, mine)
        self.d_sched.waiting_queue.extend(done)
        self.last_commit = {"rid": r, "committed": req in done,
                            "room_ok": slot_room == self.rooms[r], "covered": covered}

    def d_attend(self, r, params):
        req = self.d_req[r]
        if req not in self.d_sched.waiting_queue:
            raise Diverged("the request is not committed on decode")
        self.d_sched.waiting_queue.remove(req)
        self.d_sched.running_batch.reqs.append(req)

    def d_respond(self, r, params):
        req = self.d_req[r]
        if req not in self.d_sched.running_batch.reqs:
            raise Diverged("the request is not running on decode")
        self.d_sched.running_batch.reqs.remove(req)
        req.finished_reason = req.to_finish or sb.FINISH_LENGTH(length=0)
        req.to_finish = None
        self.d_sched.output_streamer.stream_output([req])
        self._d_release(req)
        self.d_gone.add(r)

    def _abort(self, sched, r):
        from sglang.srt.managers.io_struct import AbortReq
        sched.abort_request(AbortReq(rid=f"r{r}"))

    def p_abort(self, r, params):
        """The client's abort reaching prefill: the real ``abort_request``."""
        self._abort(self.p_sched, r)
        self.abort_reached["p"].add(r)

    def d_abort(self, r, params):
        """The client's abort reaching decode: the real ``abort_request``."""
        self._abort(self.d_sched, r)
        self.abort_reached["d"].add(r)

    def p_recv_abort(self, r, params):
        room = str(self.rooms[r]).encode()
        self._to_prefill(self._find(self.p_inbox, lambda f: f[0] == b"ABORT" and f[1] == room,
                                    "ABORT of the room reached prefill"))

    def d_recv_ack(self, r, params):
        """An ABORT_ACK reaches decode's thread; the scheduler's next
        iteration re-checks the held requests (``resolve_deferred_releases``)."""
        room = str(self.rooms[r]).encode()
        self._to_decode(self._find(self.d_inbox,
                                   lambda f: f[0] == b"ABORT_ACK" and f[1] == room,
                                   "ABORT_ACK of the room reached decode"))
        self.t_queue.resolve_deferred_releases()

    def _crash(self, side: str, r: int, call, exc, text: str):
        """A step that ends in the scheduler's death: the real call must
        raise ``exc`` (with ``text``); the rig then stops that worker."""
        try:
            call()
        except exc as e:
            if text not in str(e) and text:
                raise
            self.crashed[side][r] = True
            return
        raise Diverged(f"the real call did not raise {exc.__name__}")

    def _decode_scan(self, r):
        """Decode's scan that polls request r's receiver: the prealloc
        handshake while r is in the prealloc queue, else the transfer poll."""
        req = self.d_req[r]
        if any(e.req is req for e in self.d_queue.queue):
            return self.d_queue._update_handshake_waiters
        return lambda: self.d_transferred(r, {})

    def d_poll_popped_room(self, r, params):
        self._crash("d", r, self._decode_scan(r), KeyError, "")

    def d_unexpected_poll(self, r, params):
        self._crash("d", r, self.d_queue._update_handshake_waiters, ValueError,
                    "Unexpected poll case")

    def p_unexpected_poll(self, r, params):
        req = self.p_req[r]
        if req in self.p_sched.disagg_prefill_bootstrap_queue.queue:
            call = lambda: self.p_pop_bootstrapped(r, {})  # noqa: E731
        else:
            call = lambda: self.p_inflight(r, {})  # noqa: E731
        self._crash("p", r, call, RuntimeError, "Unexpected poll state")

    def d_prealloc_drop(self, r, params):
        done, failed = self._prealloc_scan(r)
        if done or not failed:
            raise Diverged("pop_preallocated did not drop it")

    def d_deferred_timeout(self, r, params):
        """The held request's deadline passes: the real
        ``resolve_deferred_releases`` with decode's clock an hour on."""
        real = time.monotonic
        later = types.SimpleNamespace(monotonic=lambda: real() + 3600.0, time=time.time,
                                      perf_counter=time.perf_counter)
        with mock.patch.object(dc, "time", later):
            self.t_queue.resolve_deferred_releases()

    def p_req_waiting_timeout(self, r, params):
        """``_poll_timeout_aborts`` hands this worker's own ``abort_request``
        an AbortReq with the timeout's message (sch 21:3379-3401)."""
        from sglang.srt.managers.io_struct import AbortReq
        self.p_sched.abort_request(AbortReq(rid=f"r{r}",
                                            abort_message="Request waiting timeout reached."))
        self.abort_reached["p"].add(r)

    def xfer_fail(self, r, params):
        """With r's write in flight, its batch times out (the engine returns
        -1 and keeps the blocks, which land at ``xfer_stray_lands``);
        otherwise the worker takes r's chunk and finds decode's session
        failed.  Either way Mooncake now lists decode's session as failed,
        and every later chunk for it fails early until the failed-session
        probe (``SGLANG_ENABLE_FAILED_SESSION_PROBE``: off up to 0.5.22, on
        in 0.5.23) takes it off the list: where the probe runs, the rig
        lets its real pass succeed right after the failure (the timing the
        model assumes: decode's session recovers before the next chunk)."""
        if self.gate.at_engine():
            self.engine.fail_next = True
            self.gate.write()
        else:
            self.p_mgr.failed_sessions.add(f"{_D_IP}:{_D_PORT}")
            self.gate.dequeue()
        if _probe_enabled():
            self.engine.send_probe = lambda session_id: 0
            self.p_mgr._run_one_probe_pass()

    def xfer_stray_lands(self, r, params):
        if not self.engine.stray:
            raise Diverged("no write of the request was given up")
        for data, dst in self.engine.stray:
            ctypes.memmove(dst, data, len(data))
            self.engine.writes.append((0, dst, len(data)))
        self.engine.stray = []

    # ---------------------------------------------------------- observation
    def _p_stage(self, r) -> str:
        req = self.p_req[r]
        if req is None:
            return "absent"
        s = self.p_sched
        if req in s.disagg_prefill_bootstrap_queue.queue:
            return "bootstrap"
        if req in self.p_sched.waiting_queue:
            return "waiting"
        if req in self.p_sched.last_batch.reqs:
            return "forwarded"
        if req in s.disagg_prefill_inflight_queue:
            return "inflight"
        return "gone" if self.seen_p[r] else "door"

    def _d_stage(self, r) -> str:
        req = self.d_req[r]
        if req is None:
            return "absent"
        q, tq = self.d_queue, self.t_queue
        if any(e.req is req for e in q.queue) or any(e.req is req for e in q.pending_reqs):
            return "prealloc"
        if req in q.retracted_queue:
            return "retracted"
        if any(e.req is req for e in tq.queue):
            return "transfer"
        if any(e[0].req is req for e in getattr(tq, "_deferred_releases", [])):
            return "held"
        if req in self.d_sched.waiting_queue:
            return "waiting"
        if req in self.d_sched.running_batch.reqs:
            return "running"
        if r in self.d_retracting:
            return "door"
        return "gone" if self.seen_d[r] else "door"

    def final(self, landed: List[int]) -> Dict[str, Any]:
        """Facts the property readers need after the last step: what each
        manager still keeps for each request's room, whether anything of
        the room is still on the wire, and the decode pages the last step's
        writes landed in."""
        p, d = self.p_mgr, self.d_mgr
        left, wire = [], []
        for room in self.rooms:
            left.append(bool(
                room in p.request_status or room in p.transfer_infos
                or room in p.failure_records or room in p._deferred_ack_targets
                or room in p._deferred_ack_poisoned_rooms or p._staging_outstanding.get(room)
                or room in d.request_status or room in d._deferred_abort_ack_tracker
                or d.prefill_response_tracker.get(room)))
            name = str(room).encode()
            # an ABORT_ACK for a room decode tracks no hold for changes
            # nothing when it arrives (note_abort_ack, cc 19:391-396)
            live = [f for f in self.p_inbox + self.d_inbox
                    if not (f[0] == b"ABORT_ACK" and room not in d._deferred_abort_ack_tracker)]
            wire.append(any(name in f[:2] for f in live)
                        or any(c.room == room for c in self.gate.items)
                        or self.gate.at_engine() or bool(self.engine.stray))
        return {"room_left": left, "room_on_wire": wire, "landed": landed,
                "held_without_ack": self._held_without_ack(),
                "commit": self.last_commit,
                "abort_reached": {k: sorted(v) for k, v in self.abort_reached.items()}}

    def _held_without_ack(self) -> List[bool]:
        """Per request: decode holds it for a drain ack that prefill, which
        has handled its ABORT and drained the room (not poisoned, nothing
        outstanding), has not sent and decode has not counted."""
        p, d = self.p_mgr, self.d_mgr
        out = []
        for r, room in enumerate(self.rooms):
            req = self.d_req[r]
            held = req is not None and any(e[0].req is req for e in self.t_queue._deferred_releases)
            tracker = d._deferred_abort_ack_tracker.get(room)
            acks = getattr(tracker, "prefill_ranks", tracker) or set()
            name = str(room).encode()
            # an ABORT is this request's when its own step sent it (the
            # frame names the room only)
            pending = (any(f[0] == b"ABORT" and f[1] == name and self._sender_of(f) == r
                           for f in self.p_inbox)
                       or any(f[0] == b"ABORT_ACK" and f[1] == name for f in self.d_inbox))
            out.append(bool(held and room not in p._deferred_ack_poisoned_rooms
                            and not p._staging_outstanding.get(room) and 0 not in acks
                            and not pending and not self.gate.at_engine()))
        return out

    def _sender_of(self, frame) -> Optional[int]:
        """The request whose step sent ``frame``."""
        return self.sent_by.get(id(frame), (None, None))[1]

    # ------------------------------------------------------------- settle
    def settle(self, rounds: int = 12) -> Dict[str, Any]:
        """Run both workers' own steps, without any timeout or client
        action, until nothing changes: every message delivered, every
        queued chunk written, every scan of both schedulers' loops run on
        its whole queue, every prefilled request forwarded and its result
        processed, every committed request decoded and answered.  What the
        liveness properties' counterexamples claim is that here some request
        stays unanswered (or held after its abort) until a timeout."""
        last = self.observe()
        for k in range(1, rounds + 1):
            try:
                self._own_round()
            except Exception as e:  # a scheduler died: nobody waits any more
                return {"rounds": k, "crash": _error(e), "observation": self.observe()}
            now = self.observe()
            if now == last:
                return {"rounds": k, "crash": None, "observation": now, "quiet": True}
            last = now
        return {"rounds": rounds, "crash": None, "observation": last, "quiet": False}

    def _try(self, step, r):
        try:
            getattr(self, step)(r, {})
        except Diverged:
            pass

    def _own_round(self):
        for frame in [f for f in self.p_inbox if f[0] != b"None"]:
            self._to_prefill(frame)
        for frame in list(self.d_inbox):
            self._to_decode(frame)
        self.t_queue.resolve_deferred_releases()
        while not self.gate.empty():
            self.gate.dequeue()
            self.gate.write()
        for r in range(self.n):
            step = _OWN_STEP["p"].get(self._p_stage(r))
            if step:
                self._try(step, r)
            step = _OWN_STEP["d"].get(self._d_stage(r))
            if step:
                self._try(step, r)

    def _finished(self, req, r, side) -> Optional[str]:
        """The request's finish: its ``finished_reason``, or an abort when
        ``abort_request`` dropped it from a queue and echoed the abort."""
        if req is None:
            return None
        got = _kind(req.finished_reason)
        return "abort" if got is None and r in self.echoed[side] else got

    def observe(self) -> Dict[str, Any]:
        out = {"p": [], "d": [], "p_room": [], "d_room": []}
        for r in range(self.n):
            preq, dreq = self.p_req[r], self.d_req[r]
            out["p"].append({"stage": self._p_stage(r),
                             "to_finish": None if preq is None else _kind(preq.to_finish),
                             "finished": self._finished(preq, r, "p"),
                             "answer": self.p_answer[r], "rejected": self.p_rejected[r],
                             "crashed": self.crashed["p"][r]})
            dstage = self._d_stage(r)
            out["d"].append({"stage": dstage,
                             "to_finish": None if dreq is None else _kind(dreq.to_finish),
                             "finished": self._finished(dreq, r, "d"),
                             "pages": [] if dreq is None else self.d_pool.model_pages(dreq),
                             "answer": self.d_answer[r], "rejected": self.d_rejected[r],
                             "crashed": self.crashed["d"][r]})
            out["p_room"].append(kvadapter.poll_name(self.p_mgr.request_status.get(self.rooms[r])))
            out["d_room"].append(kvadapter.poll_name(self.d_mgr.request_status.get(self.rooms[r])))
        out["writers"] = [self.d_pool.writer(p) for p in range(self.d_pool.pages)]
        return out


# the step each scheduler takes next for a request at each stage, in its own
# loop (``Rig.settle``)
_OWN_STEP = {"p": {"door": "p_door", "bootstrap": "p_pop_bootstrapped", "waiting": "p_forward",
                   "forwarded": "p_result", "inflight": "p_inflight"},
             "d": {"door": "d_door", "prealloc": "d_prealloc", "transfer": "d_transferred",
                   "waiting": "d_attend", "running": "d_respond"}}


def _probe_enabled() -> bool:
    flag = getattr(mc.envs, "SGLANG_ENABLE_FAILED_SESSION_PROBE", None)
    return bool(flag is not None and flag.get())


def _default_allocation_policy() -> Optional[str]:
    get_disagg = getattr(kvadapter.cc, "get_disagg", None)
    if get_disagg is None:
        return None
    return getattr(get_disagg(), "disaggregation_decode_allocation_policy", None)


def _error(e: BaseException) -> str:
    """The exception and where in the wheel it was raised."""
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    where = next((f for f in reversed(frames) if "sglang" in f.filename), frames[-1])
    path = where.filename.split("sglang/srt/")[-1]
    return f"{type(e).__name__}: {e} ({path}:{where.lineno})"


def _takes_req(pool: Pool) -> bool:
    import inspect
    params = list(inspect.signature(pool.req_to_token_pool.free).parameters)
    return params[:1] == ["req"]


def _alloc_n(pool: Pool) -> bool:
    import inspect
    params = list(inspect.signature(pool.req_to_token_pool.alloc).parameters)
    return params[:1] in (["need_size"], ["n"], ["size"])


STEPS = ("p_intake", "d_intake", "p_door", "d_door", "d_prealloc", "p_recv_metadata",
         "p_pop_bootstrapped", "p_forward", "p_result", "p_inflight", "xfer_dequeue",
         "xfer_write", "d_recv_status", "d_transferred", "d_attend", "d_respond",
         "p_abort", "d_abort", "p_recv_abort", "d_recv_ack", "d_poll_popped_room",
         "d_unexpected_poll", "p_unexpected_poll", "d_prealloc_drop", "d_deferred_timeout",
         "p_req_waiting_timeout", "xfer_fail", "xfer_stray_lands", "d_retract", "d_resume")


def replay(trace: Dict[str, Any]) -> Dict[str, Any]:
    """Drive the rig through ``trace["steps"]``; the observation after the
    initial state and after each step, and where it stopped and why."""
    rig = Rig(trace["config"])
    observations = [rig.observe()]
    stop = None
    landed: List[int] = []
    with rig.stack:
        rig._patches()
        for i, step in enumerate(trace["steps"], start=1):
            name, r = step["action"], step["rid"]
            before = len(rig.engine.writes)
            if name not in STEPS:
                stop = {"step": i, "why": "not-driven", "detail": f"no real driver for {name}"}
                break
            try:
                getattr(rig, name)(r, step.get("params", {}))
            except Diverged as e:
                stop = {"step": i, "why": "cannot-step", "detail": str(e)}
                break
            except Exception as e:
                stop = {"step": i, "why": "error", "detail": _error(e)}
                break
            for f in rig.p_inbox + rig.d_inbox:
                rig.sent_by.setdefault(id(f), (f, r))
            observations.append(rig.observe())
            landed = rig.d_pool.pages_at([d for _, d, _ in rig.engine.writes[before:]])
        final = rig.final(landed)
        if stop is None and trace.get("settle"):
            final["settled"] = rig.settle()
    rig.gate.close()
    return {"observations": observations, "stop": stop, "final": final}
