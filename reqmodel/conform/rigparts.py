"""The real objects of one rank of the trace rig (``tracerig.py``): its KV
pool, its transfer worker's gate and engine, its Mooncake KV manager, and
the collectives that tie a role's ranks together.

Runs in the conformance worker.  A rank's pool is a real request pool and
paged allocator with a one-layer K/V tensor pair; each token row holds one
int64 per attention head the rank keeps (the row's value: the last writer's
rid + 1).  Several ranks of one role are threads of the worker; their CPU
group's all-reduces (the poll reduces of ``disaggregation/utils.py``) meet
in :class:`Collective` in place of gloo.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import threading
import time
import types
from typing import Any, Callable, Dict, List, Optional, Sequence
from unittest import mock

import torch

import adapter
import kvadapter
from adapter import du
from kvadapter import mc

PAGE = 16
ROOM0 = 1000
ADDR = f"10.1.0.1:{adapter.BOOTSTRAP_PORT}"  # the prefill bootstrap server
_WAIT = 10.0
MEET = 3.0  # seconds a rank waits at a collective for its peers


def p_ip(q: int) -> str:
    """Prefill rank q's address (its bootstrap thread and its sessions)."""
    return f"10.1.0.{q + 1}"


def p_port(q: int) -> int:
    return 9000 + q


def d_ip(k: int) -> str:
    """Decode rank k's address (``kvadapter``'s convention)."""
    return f"10.0.0.{k + 1}"


def d_port(k: int) -> int:
    return 17000 + k


def _rank_of(addr: str) -> int:
    """``tcp://10.x.0.<n+1>:<port>`` or ``10.x.0.<n+1>`` -> rank n."""
    host = addr.split("//")[-1]
    host = host.rsplit(":", 1)[0] if ":" in host else host
    return int(host.rsplit(".", 1)[1]) - 1


prefill_rank_of = decode_rank_of = _rank_of


class _Closed(BaseException):
    """Ends the transfer worker thread when its replay is over."""


class Diverged(Exception):
    """The real code cannot take the step the trace takes."""


# ------------------------------------------------------------- the KV pools

class Pool:
    """A real request pool, paged allocator and a one-layer K/V tensor pair
    with one int64 per token and head (the value: last writer rid + 1).  A
    prefill TP rank keeps its own head; decode, one rank below several
    prefill ranks, keeps every head, each written by its own prefill rank
    through Mooncake's head-sliced transfer."""

    def __init__(self, pages: int, reqs: int, free_pages: Optional[List[int]] = None,
                 heads: int = 1):
        self.heads = heads
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
        self.k = torch.zeros((pages + 1) * PAGE * heads, dtype=torch.int64)
        self.v = torch.zeros((pages + 1) * PAGE * heads, dtype=torch.int64)

    @property
    def item(self) -> int:
        """Bytes of one page of one layer."""
        return PAGE * self.heads * self.k.element_size()

    def kv_args(self):
        item = self.item
        return dict(kv_data_ptrs=[self.k.data_ptr(), self.v.data_ptr()],
                    kv_data_lens=[self.k.nbytes, self.v.nbytes], kv_item_lens=[item, item])

    def pages_at(self, addrs) -> List[int]:
        """The model pages of the K rows at these addresses (others: V rows,
        metadata, ignored)."""
        base, item = self.k.data_ptr(), self.item
        return sorted({(a - base) // item - 1 for a in addrs
                       if base + item <= a < base + self.k.nbytes})

    def writer(self, model_page: int):
        """The last writer of the page (of its first token's row); with
        several heads, of each head's slice."""
        at = (model_page + 1) * PAGE * self.heads
        got = [int(self.k[at + h]) for h in range(self.heads)]
        out = [None if v == 0 else v - 1 for v in got]
        return out[0] if self.heads == 1 else out

    def rows(self, model_page: int) -> slice:
        return slice((model_page + 1) * PAGE * self.heads, (model_page + 2) * PAGE * self.heads)

    def write_tokens(self, locs, mark: int) -> None:
        """Every head of the token rows ``locs`` holds ``mark`` (a forward)."""
        rows = (locs.to(torch.int64).reshape(-1, 1) * self.heads
                + torch.arange(self.heads, dtype=torch.int64)).reshape(-1)
        self.k[rows] = mark
        self.v[rows] = mark

    def fill(self, model_page: int, mark: int) -> None:
        """Every head of every token of the page holds ``mark``."""
        self.k[self.rows(model_page)] = mark
        self.v[self.rows(model_page)] = mark

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
    engine calls of that chunk through.  Engine calls come from the worker
    thread and from its executor's threads (one per layer of a chunk, which
    can outlive the worker's call: with deferred release off, the first
    failed layer returns at once, mc 20:910-927); the gate counts them."""

    def __init__(self):
        self.cv = threading.Condition()
        self.items: List[Any] = []
        self.permits = 0
        self.open = False
        self.where = "start"  # the worker thread: "get" (waiting at the queue), "busy"
        self.waiting = 0  # engine calls waiting for the write gate
        self.active = 0  # engine calls let through and not back
        self.tasks = 0  # executor tasks submitted and not done
        self.error: Optional[BaseException] = None
        self.closed = False

    def executor(self, workers: int = 2) -> concurrent.futures.ThreadPoolExecutor:
        """The worker's executor, its tasks counted."""
        gate = self

        class Counting(concurrent.futures.ThreadPoolExecutor):
            def submit(self, fn, *args, **kwargs):
                with gate.cv:
                    gate.tasks += 1
                fut = super().submit(fn, *args, **kwargs)
                fut.add_done_callback(lambda _: gate._task_done())
                return fut
        return Counting(workers)

    def _task_done(self):
        with self.cv:
            self.tasks -= 1
            self.cv.notify_all()

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
            self.waiting += 1
            self.cv.notify_all()
            while not self.open and not self.closed:
                self.cv.wait()
            self.waiting -= 1
            if self.closed:
                raise _Closed
            self.active += 1

    def engine_done(self):
        with self.cv:
            self.active -= 1
            self.cv.notify_all()

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
        self._wait_for(lambda: self.permits == 0 and (self.where == "get" or self.waiting > 0))

    def at_engine(self) -> bool:
        with self.cv:
            return self.waiting > 0

    def _idle(self) -> bool:
        return self.where == "get" and not (self.waiting or self.active or self.tasks)

    def write(self):
        with self.cv:
            self.open = True
            self.cv.notify_all()
        self._wait_for(self._idle)
        with self.cv:
            self.open = False


class Engine:
    """Mooncake's transfer engine at its byte boundary: each block is a
    ``memmove`` between the two processes' (here: one process's) buffers.
    Every prefill rank's engine records into one list of writes."""

    def __init__(self, gate: Gate, q: int, writes: List[tuple]):
        self.gate = gate
        self.q = q
        self.writes = writes
        # the chunk's batches time out (each returns -1) while this is set
        # (a head-sliced chunk is one batch per layer's K and V) ...
        self.failing = False
        self.stray: List[tuple] = []  # ... and their blocks land later
        # every call raises while this is set, before a byte moves: a fault
        # in the worker's send (``xfer_worker_raises``)
        self.raising = False

    def get_session_id(self):
        return f"{p_ip(self.q)}:{p_port(self.q)}"

    def batch_transfer_sync(self, session_id, src, dst, lengths):
        self.gate.engine_call()
        try:
            if self.raising:
                raise RuntimeError("rig: the send raised before any block moved")
            return self._transfer(src, dst, lengths)
        finally:
            self.gate.engine_done()

    def _transfer(self, src, dst, lengths):
        if self.failing:
            # the NIC read the source while the batch ran: the late landing
            # writes those bytes, whatever prefill has put there since
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

def _kv_args(pool: Pool, meta, rank: int, total_heads: int) -> types.SimpleNamespace:
    aux_ptrs, aux_lens, aux_items = meta.get_buf_infos()[:3]
    return types.SimpleNamespace(
        **pool.kv_args(), aux_data_ptrs=aux_ptrs, aux_data_lens=aux_lens,
        aux_item_lens=aux_items, state_data_ptrs=[], state_data_lens=[],
        state_item_lens=[], state_type="none", state_types=[], state_layer_ids=[],
        state_dim_per_tensor=[], kv_layer_ids=[0, 0], prefill_start_layer=0,
        prefill_end_layer=None, mla_compression_ratios=None, engine_rank=rank,
        page_size=PAGE, kv_head_num=pool.heads, total_kv_head_num=total_heads, ib_device=None,
        gpu_id=0, decode_tp_size=1, prefill_pp_size=1, pp_rank=0, system_dp_rank=0,
        kv_checksum_enabled=False)


def manager(rank_ip: str, rank_port: int, pool: Pool, meta, engine, deferred: bool,
            mode, rank: int = 0, tp_size: int = 1, total_heads: int = 1):
    """A real Mooncake KV manager of one rank (attention TP rank ``rank`` of
    ``tp_size``), built as ``kvadapter.manager`` builds one, over the rank's
    pool and metadata buffers."""
    mgr = kvadapter.manager(rank, deferred)
    mgr.local_ip, mgr.rank_port = rank_ip, rank_port
    mgr.kv_args = _kv_args(pool, meta, rank, total_heads)
    mgr.engine = engine
    mgr.disaggregation_mode = mode
    mgr.is_mla_backend = False
    mgr.is_hybrid_mla_backend = False
    mgr.enable_trace = False
    mgr.enable_custom_mem_pool = False
    mgr.custom_mem_pool_type = None
    mgr.attn_tp_size, mgr.attn_dp_rank, mgr.attn_dp_size = tp_size, 0, 1
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




# ------------------------------------------------------------- collectives

class Collective:
    """The CPU group of one role's ranks, each rank a thread of the worker
    (``threading.current_thread().rank``): an all-reduce returns to every
    rank the element-wise MIN of what each rank brought, once all have come
    (gloo's all-reduce, replaced at its boundary like the sockets).  A rank
    that does not come within :data:`MEET` seconds leaves its peers waiting:
    the collective says so (``Unmet``) instead of hanging, and unequal
    lengths fail as gloo fails them."""

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties, timeout=MEET)
        self.values: Dict[int, list] = {}

    def _meet(self, where: str):
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise Unmet(f"the ranks did not all reach {where}") from None

    def reduce(self, values: Sequence[int], op: Callable = min) -> List[int]:
        rank = threading.current_thread().rank  # type: ignore[attr-defined]
        self.values[rank] = list(values)
        self._meet("an all-reduce")
        sizes = {k: len(v) for k, v in sorted(self.values.items())}
        if len(set(sizes.values())) > 1:
            raise RuntimeError(f"all-reduce sizes differ across ranks: {sizes}")
        out = [op(col) for col in zip(*(v for _, v in sorted(self.values.items())))]
        self._meet("the end of an all-reduce")
        return out

    def polls(self, polls: Sequence[int], group=None) -> List[int]:
        """``_all_reduce_polls``: MIN over the ranks (u 21:191-197)."""
        return self.reduce(polls)

    def flags(self, flags: Sequence[int], group=None, op=None) -> List[int]:
        """0.5.23's ``all_reduce_flags``: an empty list returns before the
        collective (u 23:292), MIN or MAX as the caller asks."""
        if not flags:
            return list(flags)
        return self.reduce(flags, max if op == torch.distributed.ReduceOp.MAX else min)


class Unmet(RuntimeError):
    """Some rank of the group did not reach a collective its peers entered."""


def run_ranks(calls: Sequence[Callable[[], Any]]) -> List[Any]:
    """Run one call per rank, each in its own thread, with the role's poll
    all-reduces meeting in one :class:`Collective`; each rank's result, or
    the first rank's exception (a rank's own error before a peer's
    ``Unmet``)."""
    if len(calls) == 1:
        return [calls[0]()]
    coll = Collective(len(calls))
    results: List[Any] = [None] * len(calls)
    errors: Dict[int, BaseException] = {}

    def run(k: int):
        try:
            results[k] = calls[k]()
        except BaseException as e:  # noqa: BLE001 - reported below, in rank order
            errors[k] = e
            coll.barrier.abort()
    threads = []
    flags = [mock.patch.object(m, "all_reduce_flags", coll.flags)
             for m in (du, adapter.dc) if hasattr(m, "all_reduce_flags")]
    with mock.patch.object(du, "_all_reduce_polls", coll.polls), contextlib.ExitStack() as st:
        for patch in flags:
            st.enter_context(patch)
        for k in range(len(calls)):
            t = threading.Thread(target=run, args=(k,), daemon=True)
            t.rank = k  # type: ignore[attr-defined]
            threads.append(t)
            t.start()
        for t in threads:
            t.join(MEET * 4)
    if errors:
        own = [e for _, e in sorted(errors.items()) if not isinstance(e, Unmet)]
        raise (own or [errors[min(errors)]])[0]
    if any(t.is_alive() for t in threads):
        raise Unmet("a rank did not come back from its scan")
    return results
