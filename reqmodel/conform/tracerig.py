"""Replay a whole counterexample on one released wheel: one set of real
objects that persist across the trace's steps (``reqmodel conform --trace``).

Runs in the conformance worker beside ``adapter.py``.  One or more prefill
TP ranks and one or more decode TP ranks (not both above one), each with its
real scheduler parts and Mooncake KV manager (the parts of one rank:
``rigparts.py``):

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

The KV pools are real tensors, one layer of K and V with one int64 per token
and head: a prefill forward writes ``rid + 1`` into every token row it
computes, and the transfer engine is replaced at its byte boundary by a
``memmove`` of the ranges Mooncake's real ``send_kvcache`` (or, below several
prefill TP ranks, ``send_kvcache_slice``: each prefill rank's heads) and
``send_aux`` compute (``batch_transfer_sync(session, src, dst, lengths)``).
So a decode page remembers which request wrote it last, head by head,
because it holds that request's bytes.

Several TP ranks of a role: each its own objects (``PrefillRank``,
``DecodeRank``), every request and abort on every rank, a scan with an
all-reduce on every rank at once as threads meeting in
``rigparts.Collective``; a step the model names per rank on that rank's
objects and frames; decode observed as the model's one picture of its ranks
plus each rank's stage.

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
from sglang.srt.session.session_controller import Session
from adapter import dc, du, pf, sb, mu
from kvadapter import mc
from rigparts import (ADDR, PAGE, ROOM0, Diverged, Engine, Gate, Pool, _Closed, _naive_extend,
                      Unmet, d_ip, d_port, decode_rank_of, manager, p_ip, p_port,
                      prefill_rank_of, run_ranks)


def _kind(reason) -> Optional[str]:
    return adapter.kind(reason)


def _cause(reason) -> str:
    """What a real finish reason tells the client ended the request (the
    model's ``Finish.cause``): ``done`` for a non-abort; an abort's status
    says the rest, as the code builds them: 400 from the intake's
    ``set_finish_with_abort``, 500 from ``prepare_abort`` on a Failed poll
    or a failed check, and the client's abort (``FINISH_ABORT()`` without a
    status, the waiting timeout's 503, ``"Aborted by AbortReq."``)."""
    if not isinstance(reason, sb.FINISH_ABORT):
        return "done"
    code = getattr(reason, "status_code", None)
    return {400: "reject", 500: "failure"}.get(int(code) if code is not None else 0, "client")


def _status(reason) -> str:
    """An answer as the client tells it: ``ok`` (200) or ``error``.  The
    HTTP status of an abort whose reason carries none is set past the
    scheduler (tokenizer manager, HTTP server), which the rig does not run;
    the seams compare finishes as kinds for the same reason."""
    return "error" if isinstance(reason, sb.FINISH_ABORT) else "ok"


def _one(values: List[Any]) -> Any:
    """The ranks' one value, or ``split:a|b`` where they differ (which no
    model value equals: a divergence)."""
    if all(v == values[0] for v in values[1:]):
        return values[0]
    return "split:" + "|".join(str(v) for v in values)


# ---------------------------------------------------------------- the ranks

class PrefillRank:
    """One prefill TP rank: its own pool (its heads), metadata buffers, KV
    manager and transfer worker, its scheduler's queues, and its own ``Req``
    of each request (every request and every abort reaches every TP rank:
    the scheduler broadcasts what it receives, ``ingest_requests``)."""

    def __init__(self, rig: "Rig", q: int, cfg: Dict[str, Any]):
        p, n = cfg["prefill"], cfg["n"]
        ranks, dranks = p.get("ranks", 1), cfg["decode"].get("ranks", 1)
        self.q = q
        # below several decode ranks prefill keeps every head, each decode
        # rank taking its own (send_kvcache_slice)
        self.pool = Pool(p["pool_pages"], n, heads=dranks)
        self.gate = Gate()
        self.engine = Engine(self.gate, q, rig.writes)
        self.meta = adapter.metadata_buffers(p["metadata_buffers"])
        self.mgr = manager(p_ip(q), p_port(q), self.pool, self.meta, self.engine,
                           cfg["deferred"], du.DisaggregationMode.PREFILL,
                           rank=q, tp_size=ranks, total_heads=max(ranks, dranks))
        self.mgr.transfer_queues = [self.gate]
        self.req: List[Any] = [None] * n
        # the status of each request's first final stream_output
        self.answer: List[Optional[int]] = [None] * n
        self.cause: List[Optional[str]] = [None] * n  # ... and its cause (_cause)
        # whether this rank's intake rejected the request (validate_input_length)
        self.rejected = [False] * n
        self.session: List[Any] = [None] * n  # its streaming session (``_intake``)
        self.echoed: set = set()  # requests answered by an abort echo
        self.seen = [False] * n  # the request has been through the door
        self.inbox: List[List[bytes]] = []  # what reached its bootstrap server
        s = adapter.result_scheduler(p["metadata_buffers"])
        s.output_streamer = rig._stream_spy(self.answer, self.req, self.cause)
        s.req_to_token_pool = self.pool.req_to_token_pool
        s.token_to_kv_pool_allocator = self.pool.allocator
        s.disagg_metadata_buffers = self.meta
        s.enable_staging = False
        s.kv_checksum_computer = None  # --disaggregation-enable-kv-checksum off
        s.send_kv_chunk = types.MethodType(pf.SchedulerDisaggregationPrefillMixin.send_kv_chunk, s)
        real = getattr(adapter.sch.Scheduler, "retire_unadmitted_request", None)
        if real is not None:  # the door calls it on its scheduler
            s.retire_unadmitted_request = types.MethodType(real, s)
        bq = s.disagg_prefill_bootstrap_queue
        bq.scheduler = s
        bq.kv_manager = self.mgr
        bq.transfer_backend = du.TransferBackend.MOONCAKE
        bq.max_total_num_tokens = p["pool_pages"] * PAGE  # the allocator's size
        bq.max_input_len = (p["intake_limit_pages"] - 1) * PAGE + 2
        bq.metadata_buffers = self.meta
        bq.token_to_kv_pool = types.SimpleNamespace(page_size=PAGE)
        s.waiting_queue = []
        s.last_batch = types.SimpleNamespace(reqs=[])  # launched, result not processed
        s.running_batch = types.SimpleNamespace(reqs=[])
        rig._abort_side(s, du.DisaggregationMode.PREFILL, self.answer, self.req, self.echoed,
                        self.cause)
        self.sched = s
        self.worker_thread: Optional[threading.Thread] = None
        self.worker_dead = False  # its thread raised out of transfer_worker

    def start_worker(self):
        executor = self.gate.executor()

        def run():
            try:
                self.mgr.transfer_worker(self.gate, executor)
            except _Closed:
                pass
            except BaseException as e:  # the worker's RuntimeError, reported at the step
                with self.gate.cv:
                    self.gate.error = e
                    self.gate.cv.notify_all()
        self.worker_thread = threading.Thread(target=run, daemon=True)
        self.worker_thread.start()
        self.gate._wait_for(lambda: self.gate.where == "get")

    def stage(self, r: int) -> str:
        req = self.req[r]
        if req is None:
            return "absent"
        s = self.sched
        if req in s.disagg_prefill_bootstrap_queue.queue:
            return "bootstrap"
        if req in s.waiting_queue:
            return "waiting"
        if req in s.last_batch.reqs:
            return "forwarded"
        if req in s.disagg_prefill_inflight_queue:
            return "inflight"
        return "gone" if self.seen[r] else "door"

    def finished(self, r: int) -> Optional[str]:
        """The request's finish: its ``finished_reason``, or an abort when
        ``abort_request`` dropped it from a queue and echoed the abort."""
        req = self.req[r]
        if req is None:
            return None
        got = _kind(req.finished_reason)
        return "abort" if got is None and r in self.echoed else got


class DecodeRank:
    """One decode TP rank: its own pool (its heads), metadata buffers, KV
    manager, prealloc and transfer queues, and its own ``Req`` of each
    request (every request and abort reaches every TP rank)."""

    def __init__(self, rig: "Rig", k: int, cfg: Dict[str, Any]):
        d, n = cfg["decode"], cfg["n"]
        dranks, pranks = d.get("ranks", 1), cfg["prefill"].get("ranks", 1)
        self.k = k
        # one decode rank below several prefill ranks keeps every head (each
        # prefill rank writes its own); several decode ranks below one
        # prefill rank keep one head each (send_kvcache_slice either way:
        # the attention TP sizes differ)
        self.pool = Pool(d["pool_pages"], n, heads=pranks)
        self.meta = adapter.metadata_buffers(d["metadata_buffers"])
        session = types.SimpleNamespace(get_session_id=lambda: f"{d_ip(k)}:{d_port(k)}")
        self.mgr = manager(d_ip(k), d_port(k), self.pool, self.meta, session, cfg["deferred"],
                           du.DisaggregationMode.DECODE, rank=k, tp_size=dranks,
                           total_heads=max(pranks, dranks))
        # what _resolve_rank_mapping computes, non-MLA (cc 21:1013-1052): one
        # decode rank below ``pranks`` prefill ranks hears from all of them;
        # ``dranks`` decode ranks below one prefill rank each take its slice
        self.mgr.prefill_info_table[ADDR] = self.prefill_info = types.SimpleNamespace(
            target_tp_rank=0, target_tp_ranks=list(range(pranks)), target_cp_ranks=[0],
            target_pp_ranks=[0], required_dst_info_num=dranks,
            required_prefill_response_num=pranks, attn_tp_size=pranks,
            attn_cp_size=1, dp_size=1, pp_size=1, is_dummy=False,
            # 0.5.22+ checks both roles run one policy; the default on both
            decode_allocation_policy=_default_allocation_policy())
        # no network: a fetch of the prefill's parallel info finds only what
        # the table holds (the trace's d_fetch_* steps answer or fail it)
        self.mgr.try_ensure_parallel_info = lambda addr: addr in self.mgr.prefill_info_table
        self.req: List[Any] = [None] * n
        self.answer: List[Optional[int]] = [None] * n
        self.cause: List[Optional[str]] = [None] * n
        self.rejected = [False] * n
        self.session: List[Any] = [None] * n
        self.echoed: set = set()
        self.seen = [False] * n
        self.gone: set = set()
        self.retracting: set = set()  # retracted, not yet back at decode's door
        self.inbox: List[List[bytes]] = []  # what prefill's managers sent it
        s = adapter.prealloc_scheduler()
        s.output_streamer = rig._stream_spy(self.answer, self.req, self.cause)
        s.metrics_reporter = types.SimpleNamespace(enable_metrics=False)
        s.batch_result_processor = mock.MagicMock()
        s.spec_algorithm = types.SimpleNamespace(is_none=lambda: True, is_eagle=lambda: False)
        s.kv_checksum_computer = None
        # 0.5.23's resume waits for the forward stream before its restore
        # (dc 23:1082-1087): a GPU stream order, and the rig runs no forward
        s.enable_overlap = False
        tq = adapter.transfer_queue(s, d["metadata_buffers"], cfg["deferred"])
        tq.metadata_buffers = self.meta
        tq._skipped_checksum_signatures = set()
        q = adapter.decode_queue(s, d["metadata_buffers"])
        del q._check_if_req_exceed_kv_capacity  # the real check, on the real allocator
        q.transfer_backend = du.TransferBackend.MOONCAKE
        q.kv_manager = self.mgr
        q.req_to_token_pool = self.pool.req_to_token_pool
        q.token_to_kv_pool_allocator = self.pool.allocator
        q.req_to_metadata_buffer_idx_allocator = tq.req_to_metadata_buffer_idx_allocator
        q.metadata_buffers = self.meta
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
        rig._abort_side(s, du.DisaggregationMode.DECODE, self.answer, self.req, self.echoed,
                        self.cause)
        self.sched, self.queue, self.tq = s, q, tq

    def stage(self, r: int) -> str:
        req = self.req[r]
        if req is None:
            return "absent"
        q, tq = self.queue, self.tq
        if any(e.req is req for e in q.queue) or any(e.req is req for e in q.pending_reqs):
            return "prealloc"
        if req in q.retracted_queue:
            return "retracted"
        if any(e.req is req for e in tq.queue):
            return "transfer"
        if self.holds(r):
            return "held"
        if req in self.sched.waiting_queue:
            return "waiting"
        if req in self.sched.running_batch.reqs:
            return "running"
        if r in self.retracting:
            return "door"
        return "gone" if self.seen[r] else "door"

    def holds(self, r: int) -> bool:
        req = self.req[r]
        return req is not None and any(e[0].req is req
                                       for e in getattr(self.tq, "_deferred_releases", []))

    def finished(self, r: int) -> Optional[str]:
        req = self.req[r]
        if req is None:
            return None
        got = _kind(req.finished_reason)
        return "abort" if got is None and r in self.echoed else got

    def entry(self, r: int):
        """Request r's entry in this rank's transfer queue."""
        return next((e for e in self.tq.queue if e.req is self.req[r]), None)


# ---------------------------------------------------------------- the rig

class Rig:
    """The persistent real objects of one trace replay: one or more prefill
    TP ranks (``self.P``) and decode TP ranks (``self.D``), not both above
    one (as the scenario format)."""

    def __init__(self, cfg: Dict[str, Any]):
        self.cfg = cfg
        self.n = cfg["n"]
        self.rooms = [ROOM0 + k for k in cfg["room_of"]]
        self.stack = contextlib.ExitStack()
        self.writes: List[tuple] = []  # every prefill rank's engine's blocks
        self.crashed = {"p": [False] * self.n, "d": [False] * self.n}
        self.abort_reached = {"p": set(), "d": set()}  # the client's abort reached it
        self.last_commit: Optional[Dict[str, Any]] = None
        # id(frame) -> (frame, the request whose step sent it); the frame is
        # kept so that its id is not reused
        self.sent_by: Dict[int, tuple] = {}
        # id(frame) -> the prefill rank whose manager sent it to decode, and
        # the decode rank whose receiver or manager sent it to prefill
        self.from_rank: Dict[int, int] = {}
        self.from_drank: Dict[int, int] = {}
        # (decode rank, room) -> (prefill rank, request whose step sent it)
        # of each Success report the rank's thread counted while the room's
        # tracker was open
        self.reports: Dict[tuple, List[tuple]] = {}
        self.P = [PrefillRank(self, q, cfg) for q in range(cfg["prefill"].get("ranks", 1))]
        self.D = [DecodeRank(self, k, cfg) for k in range(cfg["decode"].get("ranks", 1))]
        for rank in self.P:
            rank.start_worker()

    # ---------------------------------------------------------------- setup
    def _stream_spy(self, answers: List[Optional[int]], reqs: List[Any],
                    causes: List[Optional[str]]):
        def stream_output(out, *args, **kwargs):
            for req in out:
                r = _rid_in(reqs, req)
                if r is not None and req.finished() and answers[r] is None:
                    answers[r] = _status(req.finished_reason)
                    causes[r] = _cause(req.finished_reason)
        return types.SimpleNamespace(stream_output=stream_output)

    def _abort_side(self, s, mode, answers, reqs, echoed, causes):
        """What the real ``abort_request`` reads on a scheduler: the echo to
        the tokenizer manager is a spy that records the answer."""
        s.disaggregation_mode = mode
        s.ps = adapter._PARALLEL
        s.mm_receiver = None
        s.dllm_config = None
        s.enable_hicache_storage = False
        s.grammar_manager = mock.MagicMock()
        s._pending_chunked_abort_req = None

        def send_output(out, req=None, *a, **k):
            r = _rid_in(reqs, req) if req is not None else None
            if r is not None and answers[r] is None:
                # an abort echo (method 1): the tokenizer manager finishes
                # the request as an abort (tm 19:3203-3209)
                answers[r] = "error"
                causes[r] = "client"
                echoed.add(r)
        s.ipc_channels = types.SimpleNamespace(
            send_to_tokenizer=types.SimpleNamespace(send_output=send_output))
        s.rust_server = None
        s.enable_continuous_input_polling = False
        s.result_queue = []
        for name in ("abort_request", "collect_inflight_reqs", "_collect_inflight_batches",
                     "send_abort_output"):  # the last two from 0.5.22 / 0.5.23
            if hasattr(adapter.sch.Scheduler, name):
                setattr(s, name, types.MethodType(getattr(adapter.sch.Scheduler, name), s))

    # ------------------------------------------------------------ sockets
    def _patches(self):
        rig = self

        class Sock:
            """The socket a receiver opens to one prefill rank's server."""

            def __init__(self, q: int, k: int):
                self.q, self.k = q, k

            def send_multipart(self, frames, *a, **kw):
                rig._to_prefill_inbox(self.k)(f"tcp://{p_ip(self.q)}:0", frames)

        socks = {(k, q): Sock(q, k) for q in range(len(self.P)) for k in range(len(self.D))}
        infos = [{"rank_ip": p_ip(q), "rank_port": p_port(q), "is_dummy": False}
                 for q in range(len(self.P))]
        # a receiver's socket to one prefill rank's server, per decode rank
        self.stack.enter_context(mock.patch.object(
            mc.MooncakeKVReceiver, "_connect_to_bootstrap_server",
            lambda self, info: (socks[(decode_rank_of(self.kv_mgr.local_ip),
                                       prefill_rank_of(info["rank_ip"]))],
                                contextlib.nullcontext()), create=True))
        # (prefill_dp_rank, prefill_cp_rank, target_tp_rank, target_pp_rank)
        # in every release (cc 19:1501-1503, 23:2695-2697)
        self.stack.enter_context(mock.patch.object(
            mc.MooncakeKVReceiver, "_get_bootstrap_info_from_server",
            lambda self, dp, cp, tp, pp: dict(infos[tp]), create=True))
        for rank in self.P:
            rank.mgr._send_multipart_locked = self._to_decode_inbox(rank.q)
        for drank in self.D:
            drank.mgr._send_multipart_locked = self._to_prefill_inbox(drank.k)
        if hasattr(mc.MooncakeKVSender, "supports_host_tensor_indices"):
            # 0.5.23 copies the page indices device-to-host into pinned memory
            # behind a CUDA event; on CPU the sender takes the release's own
            # synchronous path for senders without it (the same indices)
            self.stack.enter_context(mock.patch.object(
                mc.MooncakeKVSender, "supports_host_tensor_indices", False))
        for rank in self.D + self.P:
            self.stack.enter_context(_naive_extend(rank.pool.allocator))
        self.stack.enter_context(mock.patch.object(pf, "release_kv_cache", self._p_release))
        self.stack.enter_context(mock.patch.object(dc, "release_kv_cache", self._d_release))
        self.stack.enter_context(mock.patch.object(adapter.sch, "release_kv_cache",
                                                   self._either_release))
        if hasattr(pf, "maybe_cache_unfinished_req"):
            self.stack.enter_context(mock.patch.object(pf, "maybe_cache_unfinished_req",
                                                       lambda *a, **k: None))
        for rank in self.P:
            rank.sched.checkpoint_disagg_prefill = lambda *a, **k: None
            rank.sched.cache_unfinished_disagg_prefill = lambda *a, **k: None

    def _to_decode_inbox(self, q: int):
        """Prefill rank q's manager sending to a decode rank's endpoint."""
        def send(endpoint, frames, is_ipv6=False):
            frame = list(frames)
            self.from_rank[id(frame)] = q
            self.D[kvadapter._rank_of_endpoint(endpoint)].inbox.append(frame)
        return send

    def _to_prefill_inbox(self, k: int):
        """Decode rank k's receiver or manager sending to a prefill rank."""
        def send(endpoint, frames, is_ipv6=False):
            frame = list(frames)
            self.from_drank[id(frame)] = k
            self.P[prefill_rank_of(endpoint)].inbox.append(frame)
        return send

    def _d_inboxes(self) -> List[List[bytes]]:
        return [f for rank in self.D for f in rank.inbox]

    def _rank_of_req(self, req) -> Optional[PrefillRank]:
        return next((rank for rank in self.P if any(x is req for x in rank.req)), None)

    def _p_release(self, req, *args, **kwargs):
        rank = self._rank_of_req(req)
        if rank is not None:
            _end_session_turn(req)
            self._free(rank.pool, req)

    def _d_release(self, req, *args, **kwargs):
        rank = next((d for d in self.D if any(x is req for x in d.req)), None)
        if rank is not None:
            _end_session_turn(req)
            self._free(rank.pool, req)

    def _either_release(self, req, *args, **kwargs):
        self._d_release(req)
        self._p_release(req)

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
    def _intake(self, ranks, role: Dict[str, Any], r: int):
        """Every rank of a role takes the request in: its own ``Req``, and
        ``validate_input_length`` against the role's limit."""
        for rank in ranks:
            req = adapter.make_req(f"r{r}", self.cfg["tokens"][r], self.rooms[r], host=p_ip(0))
            err = mu.validate_input_length(req, (role["intake_limit_pages"] - 1) * PAGE + 2,
                                           role["auto_truncate"])
            if err:
                req.set_finish_with_abort(err)
            if self.cfg.get("sessions"):
                # a streaming session whose create_req accepted this turn:
                # it sets the in-flight mark (SC 19:329, 20:343, 21:344,
                # 22:344, 23:349) and the Req keeps the session
                req.session = Session(1 << 20, f"s{r}", streaming=True)
                req.session._inflight = True
                rank.session[r] = req.session
            rank.req[r] = req
            rank.rejected[r] = bool(err)

    def p_intake(self, r, params):
        self._intake(self.P, self.cfg["prefill"], r)

    def d_intake(self, r, params):
        self._intake(self.D, self.cfg["decode"], r)

    def p_door(self, r, params):
        for rank in self.P:
            rank.sched.disagg_prefill_bootstrap_queue.add(rank.req[r], 1)
            rank.seen[r] = True

    def d_door(self, r, params):
        for rank in self.D:
            retracted = r in rank.retracting
            rank.retracting.discard(r)
            rank.queue.add(rank.req[r], is_retracted=retracted)
            rank.seen[r] = True

    def d_retract(self, r, params):
        """R1 memory retract on the real request: ``release_req`` frees its
        KV and runs ``reset_for_retract``, without the host copy
        (``offload_kv=False``: the copy needs a real KV cache, which the
        rig's pools are not; ``d_resume`` writes the request's own bytes back
        as the restore would).  ``_add_request_to_queue(is_retracted=True)``
        is the next step, ``d_door``."""
        for rank in self.D:
            req = rank.req[r]
            if req not in rank.sched.running_batch.reqs:
                raise Diverged("the request is not running on decode")
            rank.sched.running_batch.reqs.remove(req)
            with mock.patch.object(sb, "release_kv_cache", self._d_release, create=True):
                sb.release_req(req=req, remaing_req_count=0,
                               req_to_token_pool=rank.pool.req_to_token_pool,
                               token_to_kv_pool_allocator=rank.pool.allocator,
                               tree_cache=rank.sched.tree_cache, hisparse_coordinator=None,
                               offload_kv=False)
            rank.retracting.add(r)

    def d_resume(self, r, params):
        """R5: the real ``resume_retracted_reqs`` (its budgets, ``_pre_alloc``
        on the real allocator, the trace's pages first); its restore of the
        host copy writes the request's own bytes into the new pages."""
        name = "restore_kv_cache" if hasattr(dc, "restore_kv_cache") else "retraction_restore"
        for rank in self.D:
            req = rank.req[r]
            self._choose_pages(rank.pool, params.get("pages"))

            def restore(req, *args, rank=rank, **kwargs):
                mark = _rid_in(rank.req, req) + 1
                for pg in rank.pool.model_pages(req):
                    rank.pool.fill(pg, mark)
            with mock.patch.object(dc, name, restore):
                resumed = rank.queue.resume_retracted_reqs()
            rank.sched.waiting_queue.extend(resumed)  # the event loop's glue
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

    def _every_drank(self, scan):
        """A scan of decode's loop on every decode TP rank at once, each a
        thread whose all-reduces meet the other ranks' (``run_ranks``)."""
        return run_ranks([lambda rank=rank: scan(rank) for rank in self.D])

    def _prealloc_scan(self, rank: DecodeRank, r: int):
        """Decode's prealloc scan for request r on one rank: its first call,
        the handshake, polls the whole queue (as the model's ``d_prealloc``
        does); then ``pop_preallocated`` runs on the request and on every
        entry its first loop drops (an abort: the model's step drops them
        all, ``decode.drop_scanned``), admitting only the request."""
        q = rank.queue
        req = rank.req[r]
        q._update_handshake_waiters()
        full, mine = self._only(q, "queue", lambda e: e.req is req or isinstance(
            e.req.finished_reason, sb.FINISH_ABORT))
        try:
            return q.pop_preallocated()
        finally:
            self._restore(q, "queue", full, mine)

    def _prealloc_all(self, r, pages=None):
        for rank in self.D:
            self._choose_pages(rank.pool, pages)

        def scan(rank):
            done, failed = self._prealloc_scan(rank, r)
            rank.tq.extend(done)  # the event loop's glue (dc 19:2693)
            return done, failed
        return self._every_drank(scan)

    def d_prealloc(self, r, params):
        for done, failed in self._prealloc_all(r, params.get("pages")):
            if not done:
                raise Diverged(f"pop_preallocated did not preallocate it ({len(failed)} failed)")

    def d_handshake(self, r, params):
        """0.5.19's ``pop_preallocated`` on every decode rank's whole prealloc
        queue, whose handshake polls and marks the entries and which admits
        and drops none of them."""
        for done, failed in self._every_drank(lambda rank: rank.queue.pop_preallocated()):
            if done or failed:
                raise Diverged(f"pop_preallocated took {len(done)} and dropped {len(failed)}")

    def d_prealloc_splits(self, r, params):
        """Every decode rank's ``pop_preallocated``, each deciding from its
        own pools: the model says some ranks take the request and the
        others keep it queued."""
        got = [bool(done) for done, _ in self._prealloc_all(r)]
        if all(got) or not any(got):
            raise Diverged("the decode ranks decided alike")

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

    def _to_prefill(self, q: int, frame):
        """Prefill rank q's bootstrap thread receives ``frame``, after the
        KV-args registrations a receiver sent before anything else on its
        socket."""
        rank = self.P[q]
        regs = [f for f in rank.inbox if f[0] == b"None"]
        rank.inbox = [f for f in rank.inbox if f is not frame and f not in regs]
        self._run_thread(rank.mgr, "start_prefill_thread", regs + [frame])

    def _to_decode(self, rank: DecodeRank, frame):
        rank.inbox.remove(frame)
        self._run_thread(rank.mgr, "start_decode_thread", [frame])

    def p_recv_metadata(self, r, params):
        q, k = params.get("prefill_rank", 0), params.get("rank", 0)
        room = str(self.rooms[r]).encode()
        self._to_prefill(q, self._find(self.P[q].inbox, lambda f: f[0] == room
                                       and self.from_drank.get(id(f)) == k,
                                       "metadata of the room reached prefill"))

    def _every_prank(self, scan):
        """A scan of prefill's loop on every prefill TP rank at once, each a
        thread whose poll all-reduces meet the other ranks' (``run_ranks``)."""
        return run_ranks([lambda rank=rank: scan(rank) for rank in self.P])

    def p_pop_bootstrapped(self, r, params):
        def scan(rank):
            q = rank.sched.disagg_prefill_bootstrap_queue
            req = rank.req[r]
            _poll_senders(q.queue)  # the call's poll latches every entry first
            full, mine = self._only(q, "queue", lambda e: e is req)
            try:
                got = q.pop_bootstrapped()
            finally:
                self._restore(q, "queue", full, mine)
            rank.sched.waiting_queue.extend(got)
        self._every_prank(scan)

    def p_resolve_waiting(self, r, params):
        """``resolve_waiting_queue_bootstrap`` (pf 21:597-630) on every prefill
        rank, on the stepped request alone: the real poll all-reduce, and a
        Failed poll's real ``handle_bootstrap_failure`` or a finished
        handshake's real ``finalize_bootstrap``."""
        self._prefill_scan(r, "waiting_queue", lambda s: s.resolve_waiting_queue_bootstrap())

    def p_forward(self, r, params):
        for rank in self.P:
            self._forward(rank, r)

    def _forward(self, rank: PrefillRank, r: int):
        req = rank.req[r]
        if req not in rank.sched.waiting_queue:
            raise Diverged("the request is not in prefill's waiting queue")
        rank.sched.waiting_queue.remove(req)
        n = len(req.origin_input_ids)
        need = -(-n // PAGE) * PAGE
        pool = rank.pool
        idx = pool.req_to_token_pool.alloc(1)[0] if _alloc_n(pool) else \
            pool.req_to_token_pool.alloc([req])[0]
        req.kv.req_pool_idx = idx
        locs = pool.allocator.alloc(need)
        if locs is None:
            raise Diverged("prefill's pool has no room for the chunk")
        pool.req_to_token_pool.req_to_token[idx, :need] = locs.to(torch.int32)
        pool.write_tokens(locs[:n], r + 1)
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
        rank.sched.last_batch.reqs.append(req)

    def p_result(self, r, params):
        from sglang.srt.managers.utils import GenerationBatchResult
        for rank in self.P:
            req = rank.req[r]
            if req not in rank.sched.last_batch.reqs:
                raise Diverged("no forward of the request is due")
            rank.sched.last_batch.reqs.remove(req)
            req.inflight_middle_chunks = 0
            batch = mock.MagicMock()
            batch.reqs, batch.spec_info, batch.return_logprob = [req], None, False
            result = GenerationBatchResult(next_token_ids=torch.tensor([11]))
            rank.sched.process_batch_result_disagg_prefill(batch, result)

    def p_inflight(self, r, params):
        self._prefill_scan(r, "disagg_prefill_inflight_queue",
                           lambda s: s.process_disagg_prefill_inflight_queue(), poll_first=True)

    def _prefill_scan(self, r, attr, run, poll_first=False):
        """A scan of one of prefill's scheduler queues (``attr``), ``run`` on
        the scheduler of every prefill rank at once, on the stepped request
        alone (``_only``), after the whole queue's poll where the call polls
        every entry first (``poll_first``)."""
        def scan(rank):
            s = rank.sched
            req = rank.req[r]
            if poll_first:
                _poll_senders(getattr(s, attr))
            full, mine = self._only(s, attr, lambda e: e is req)
            try:
                run(s)
            finally:
                self._restore(s, attr, full, mine)
        self._every_prank(scan)

    def _prank(self, params) -> PrefillRank:
        return self.P[params.get("prefill_rank", 0)]

    def xfer_dequeue(self, r, params):
        self._prank(params).gate.dequeue()

    def xfer_write(self, r, params):
        self._prank(params).gate.write()

    def d_recv_status(self, r, params):
        """Prefill rank q's status report of the room reaches decode: each
        decode rank's copy (``conclude_transfer`` reports to every decode
        endpoint of the room, mc 21:2356-2367) to that rank's thread."""
        q = params.get("prefill_rank", 0)
        room = str(self.rooms[r]).encode()
        for rank in self.D:
            frame = self._find(rank.inbox, lambda f: f and f[0] == room
                               and self.from_rank.get(id(f)) == q,
                               "status report of the room reached decode")
            self._count_report(rank, frame)
            self._to_decode(rank, frame)

    def d_drop_late_status(self, r, params):
        """A status report for a room decode no longer tracks reaches each
        decode rank's thread, whose real handler drops it (or, on 0.5.19,
        does not re-create the room)."""
        self.d_recv_status(r, params)

    def _count_report(self, rank: DecodeRank, frame):
        """Note whose Success report the rank's thread is about to count."""
        room, status, _ = kvadapter._parse_status(rank.mgr, frame)
        key = (rank.k, int(room))
        if not rank.mgr.prefill_response_tracker.get(int(room)):
            self.reports[key] = []
        if int(status) == int(kvadapter.KVPoll.Success):
            self.reports.setdefault(key, []).append((self.from_rank.get(id(frame)),
                                                     self._sender_of(frame)))

    def d_transferred(self, r, params):
        room = self.rooms[r]

        def scan(rank):
            q = rank.tq
            req = rank.req[r]
            full, mine = self._only(q, "queue", lambda e: e.req is req)
            # what a commit would rest on, read before the real code frees
            # the slot: the room prefill's aux wrote into the request's
            # metadata slot, and whether each reserved page holds this
            # request's bytes (every head)
            idx = mine[0].metadata_buffer_index
            slot_room = None if idx is None or idx < 0 else int(rank.meta.bootstrap_room[idx, 0])
            covered = all(_slices(rank.pool.writer(pg)) == [r] * rank.pool.heads
                          for pg in rank.pool.model_pages(req))
            # the prefill ranks whose Success the room's tracker counts, and
            # of those the ranks whose report came from this request's own
            # transfer
            counted = set(rank.mgr.prefill_response_tracker.get(room) or ())
            own = {q for q, by in self.reports.get((rank.k, room), []) if by == r and q in counted}
            _poll_queue(full)  # the call's poll latches every entry first
            try:
                done = q.pop_transferred()
            finally:
                self._restore(q, "queue", full, mine)
            rank.sched.waiting_queue.extend(done)
            return {"committed": req in done, "room_ok": slot_room == room,
                    "covered": covered, "own_reports": len(own)}
        got = self._every_drank(scan)
        self.last_commit = {"rid": r, "committed": any(g["committed"] for g in got),
                            "room_ok": all(g["room_ok"] for g in got if g["committed"]),
                            "covered": all(g["covered"] for g in got if g["committed"]),
                            "own_reports": min(g["own_reports"] for g in got),
                            "ranks": len(self.P)}

    def d_attend(self, r, params):
        for rank in self.D:
            req = rank.req[r]
            if req not in rank.sched.waiting_queue:
                raise Diverged("the request is not committed on decode")
            rank.sched.waiting_queue.remove(req)
            rank.sched.running_batch.reqs.append(req)

    def d_respond(self, r, params):
        for rank in self.D:
            req = rank.req[r]
            if req not in rank.sched.running_batch.reqs:
                raise Diverged("the request is not running on decode")
            rank.sched.running_batch.reqs.remove(req)
            req.finished_reason = req.to_finish or sb.FINISH_LENGTH(length=0)
            req.to_finish = None
            rank.sched.output_streamer.stream_output([req])
            self._d_release(req)
            rank.gone.add(r)

    def _abort(self, sched, r):
        from sglang.srt.managers.io_struct import AbortReq
        sched.abort_request(AbortReq(rid=f"r{r}"))

    def p_abort(self, r, params):
        """The client's abort reaching prefill: the real ``abort_request``
        on every prefill rank."""
        for rank in self.P:
            self._abort(rank.sched, r)
        self.abort_reached["p"].add(r)

    def d_abort(self, r, params):
        """The client's abort reaching decode: the real ``abort_request``
        on every decode rank."""
        for rank in self.D:
            self._abort(rank.sched, r)
        self.abort_reached["d"].add(r)

    def p_recv_abort(self, r, params):
        q, k = params.get("prefill_rank", 0), params.get("rank", 0)
        room = str(self.rooms[r]).encode()
        self._to_prefill(q, self._find(self.P[q].inbox,
                                       lambda f: f[0] == b"ABORT" and f[1] == room
                                       and self.from_drank.get(id(f)) == k,
                                       "ABORT of the room reached prefill"))

    def d_recv_ack(self, r, params):
        """An ABORT_ACK from prefill rank q reaches decode rank k's thread;
        every rank's scheduler then re-checks its held requests
        (``resolve_deferred_releases``; 0.5.23 reduces readiness across the
        ranks)."""
        q, k = params.get("prefill_rank", 0), params.get("rank", 0)
        room = str(self.rooms[r]).encode()
        rank = self.D[k]
        self._to_decode(rank, self._find(rank.inbox,
                                         lambda f: f[0] == b"ABORT_ACK" and f[1] == room
                                         and self.from_rank.get(id(f)) == q,
                                         "ABORT_ACK of the room reached decode"))
        self._resolve_all()

    def _resolve_all(self):
        self._every_drank(lambda rank: rank.tq.resolve_deferred_releases())

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
        rank = self.D[0]
        if any(e.req is rank.req[r] for e in rank.queue.queue):
            return self._handshake_all
        return lambda: self.d_transferred(r, {})

    def _handshake_all(self):
        """Every decode rank's ``_update_handshake_waiters`` at once."""
        self._every_drank(lambda rank: rank.queue._update_handshake_waiters())

    def d_poll_popped_room(self, r, params):
        self._crash("d", r, self._decode_scan(r), KeyError, "")

    def d_unexpected_poll(self, r, params):
        self._crash("d", r, self._handshake_all, ValueError, "Unexpected poll case")

    def p_unexpected_poll(self, r, params):
        rank = self.P[0]
        if rank.req[r] in rank.sched.disagg_prefill_bootstrap_queue.queue:
            call = lambda: self.p_pop_bootstrapped(r, {})  # noqa: E731
        else:
            call = lambda: self.p_inflight(r, {})  # noqa: E731
        self._crash("p", r, call, RuntimeError, "Unexpected poll state")

    def d_prealloc_drop(self, r, params):
        for done, failed in self._prealloc_all(r):
            if done or not failed:
                raise Diverged("pop_preallocated did not drop it")

    def d_deferred_timeout(self, r, params):
        """The held request's deadline passes: the real
        ``resolve_deferred_releases`` with decode's clock an hour on, on the
        rank the trace names (up to 0.5.22 each rank checks its own
        deadline alone) or on every rank at once."""
        real = time.monotonic
        later = types.SimpleNamespace(monotonic=lambda: real() + 3600.0, time=time.time,
                                      perf_counter=time.perf_counter)
        with mock.patch.object(dc, "time", later):
            if "rank" in params:
                self.D[params["rank"]].tq.resolve_deferred_releases()
            else:
                self._resolve_all()

    def d_waiting_timeout(self, r, params):
        """Decode rank k's receiver of the request waits past
        ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``: its real ``poll()`` with
        the receiver's start an hour back (``_check_waiting_timeout``
        records the failure, goes Failed and sends that rank's ABORT).  In
        the code that poll is the transfer scan's, which handles the Failed
        in the same call; the model latches it on the receiver until its
        ``d_transferred`` step, and so does the rig (``conclude_state``).
        The same poll latches the queue's other entries."""
        from sglang.srt.disaggregation.base import KVPoll as RealPoll
        rank = self.D[params.get("rank", 0)]
        entry = rank.entry(r)
        if entry is None:
            raise Diverged("the request is not in decode's transfer queue")
        entry.kv_receiver.init_time = time.time() - 3600.0
        if entry.kv_receiver.poll() == RealPoll.Failed:
            entry.kv_receiver.conclude_state = RealPoll.Failed
        _poll_queue(rank.tq.queue)

    def d_transfer_poll(self, r, params):
        """A ``pop_transferred`` on every decode rank's whole transfer queue
        that hands nothing on: its poll latches the entries that read
        Success, and the metadata gate holds them back."""
        for done in self._every_drank(lambda rank: rank.tq.pop_transferred()):
            if done:
                raise Diverged(f"pop_transferred handed on {len(done)} request(s)")

    def p_bootstrap_timeout(self, r, params):
        """Each prefill rank's sender of the request still Bootstrapping waits
        past ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``: its real ``poll()``
        with the sender's start an hour back (``_check_bootstrap_timeout``
        records the failure and sets the room Failed).  In the code that poll
        is the bootstrap queue's scan, which handles the Failed in the same
        call; the model latches it on the sender until its ``pop_bootstrapped``
        step, and so does the rig (the sender's ``conclude_state``), for a
        request still in the bootstrap queue."""
        from sglang.srt.disaggregation.base import KVPoll as RealPoll
        for rank in self.P:
            req = rank.req[r]
            sender = req.disagg_kv_sender
            if sender is None or sender.conclude_state is not None:
                continue
            if rank.mgr.check_status(self.rooms[r]) != RealPoll.Bootstrapping:
                continue
            sender.init_time = time.time() - 3600.0
            got = sender.poll()
            if got != RealPoll.Failed:
                raise Diverged(f"the sender's poll after its bootstrap timeout gave {got}")
            if req in rank.sched.disagg_prefill_bootstrap_queue.queue:
                sender.conclude_state = RealPoll.Failed

    def p_req_waiting_timeout(self, r, params):
        """``_poll_timeout_aborts`` hands this worker's own ``abort_request``
        an AbortReq with the timeout's message (sch 21:3379-3401)."""
        from sglang.srt.managers.io_struct import AbortReq
        for rank in self.P:
            rank.sched.abort_request(AbortReq(rid=f"r{r}",
                                              abort_message="Request waiting timeout reached."))
        self.abort_reached["p"].add(r)

    def xfer_fail(self, r, params):
        """With r's write in flight, its batch times out (the engine returns
        -1 and keeps the blocks, which land at ``xfer_stray_lands``), and the
        real worker lists decode's session as failed; otherwise decode's
        session failed on traffic the trace does not show: the rig lists
        every decode rank's session, and the worker takes r's chunk and
        finds it there."""
        rank = self._prank(params)
        if rank.gate.at_engine():
            rank.engine.failing = True
            try:
                rank.gate.write()
            finally:
                rank.engine.failing = False
        else:
            rank.mgr.failed_sessions.update(f"{d_ip(k)}:{d_port(k)}" for k in range(len(self.D)))
            rank.gate.dequeue()

    def xfer_session_failed(self, r, params):
        """The worker takes r's chunk; the real failed list, which an earlier
        failed batch filled, makes it fail early."""
        self._prank(params).gate.dequeue()

    def xfer_worker_raises(self, r, params):
        """The worker takes r's chunk and its send raises before a byte moves
        (the rig's engine raises at every call while ``raising`` is set); the
        release's own handler re-raises "Transfer thread failed" (0.5.22+
        poison the room first) and the thread ends.  The rig steps that
        worker no more (the model's gate, ``State.workers_dead``)."""
        rank = self._prank(params)
        rank.engine.raising = True
        rank.gate.dequeue()
        if not rank.gate.at_engine():
            raise Diverged("the worker took the chunk without calling its engine")
        try:
            rank.gate.write()
        except RuntimeError as e:
            if "Transfer thread failed" not in str(e):
                raise
        else:
            raise Diverged("the worker's send raised and its thread went on")
        with rank.gate.cv:
            rank.gate.error = None
        rank.worker_thread.join(timeout=5)
        if rank.worker_thread.is_alive():
            raise Diverged("the transfer worker thread did not end")
        rank.worker_dead = True

    def p_probe_failed_sessions(self, r, params):
        """One pass of the rank's real probe loop (``_run_one_probe_pass``)
        with every listed decode session answering its probe."""
        rank = self._prank(params)
        rank.engine.send_probe = lambda session_id: 0
        rank.mgr._run_one_probe_pass()

    def p_dies(self, r, params):
        """The prefill instance dies: nothing to do on the real objects.  The
        rig steps none of them again (a step of a prefill process after this
        is none the trace can have: the model's gate), and its transfer
        workers stay held at their gates with whatever they had queued or
        started."""

    def _node_failure(self):
        """Decode rank 0's heartbeat reaches its threshold: the release's own
        ``_handle_node_failure`` on the prefill bootstrap address (the model
        takes the first rank's: one rank's Failed fails the MIN-reduced poll
        of every rank)."""
        self.D[0].mgr._handle_node_failure(ADDR)

    def d_node_failure(self, r, params):
        self._node_failure()

    def d_heartbeat_lost(self, r, params):
        self._node_failure()

    def _resolve_pending(self, answers: bool):
        """``_resolve_pending_reqs`` on every decode rank, the fetch of the
        prefill instance's parallel info answering (it registers the saved
        info again) or failing for the last of ``_max_ensure_retries``
        attempts."""
        for rank in self.D:
            q, mgr = rank.queue, rank.mgr

            def fetch(addr, mgr=mgr, info=rank.prefill_info):
                if answers:
                    mgr.prefill_info_table[addr] = info
                return answers
            if not answers:
                q._ensure_retry_count[ADDR] = q._max_ensure_retries - 1
            q._ensure_last_attempt_time.pop(ADDR, None)
            with mock.patch.object(mgr, "try_ensure_parallel_info", fetch):
                q._resolve_pending_reqs()

    def d_fetch_prefill_info(self, r, params):
        self._resolve_pending(True)

    def d_fetch_fails(self, r, params):
        self._resolve_pending(False)

    def xfer_stray_lands(self, r, params):
        engine = self._prank(params).engine
        if not engine.stray:
            raise Diverged("no write of the request was given up")
        for data, dst in engine.stray:
            ctypes.memmove(dst, data, len(data))
            engine.writes.append((0, dst, len(data)))
        engine.stray = []

    # ---------------------------------------------------------- observation
    def _p_inboxes(self) -> List[List[bytes]]:
        return [f for rank in self.P for f in rank.inbox]

    def final(self, landed: List[int]) -> Dict[str, Any]:
        """Facts the property readers need after the last step: what any
        manager still keeps for each request's room, whether anything of
        the room is still on the wire, and the decode pages the last step's
        writes landed in."""
        left, wire = [], []
        for room in self.rooms:
            left.append(any(
                room in p.request_status or room in p.transfer_infos
                or room in p.failure_records or room in p._deferred_ack_targets
                or room in p._deferred_ack_poisoned_rooms or p._staging_outstanding.get(room)
                for p in (rank.mgr for rank in self.P))
                or any(room in d.request_status or room in d._deferred_abort_ack_tracker
                       or d.prefill_response_tracker.get(room)
                       for d in (rank.mgr for rank in self.D)))
            name = str(room).encode()
            # an ABORT_ACK for a room decode tracks no hold for changes
            # nothing when it arrives (note_abort_ack, cc 19:391-396)
            live = self._p_inboxes() + [
                f for rank in self.D for f in rank.inbox
                if not (f[0] == b"ABORT_ACK" and room not in rank.mgr._deferred_abort_ack_tracker)]
            wire.append(any(name in f[:2] for f in live)
                        or any(any(c.room == room for c in rank.gate.items)
                               or rank.gate.at_engine() or bool(rank.engine.stray)
                               for rank in self.P))
        return {"room_left": left, "room_on_wire": wire, "landed": landed,
                "held_without_ack": self._held_without_ack(),
                "commit": self.last_commit,
                "abort_reached": {k: sorted(v) for k, v in self.abort_reached.items()},
                # the cause each worker's first answer gives, one value over its ranks
                "cause": {"p": [_one([k.cause[r] for k in self.P]) for r in range(self.n)],
                          "d": [_one([k.cause[r] for k in self.D]) for r in range(self.n)]}}

    def _held_without_ack(self) -> List[bool]:
        """Per request: some decode rank holds it for a drain ack that some
        prefill rank, which has handled that decode rank's ABORT and drained
        the room (not poisoned, nothing outstanding), has not sent and the
        decode rank has not counted."""
        out = []
        for r, room in enumerate(self.rooms):
            name = str(room).encode()
            missing = False
            for drank in self.D:
                if not drank.holds(r):
                    continue
                tracker = drank.mgr._deferred_abort_ack_tracker.get(room)
                acks = getattr(tracker, "prefill_ranks", tracker) or set()
                for rank in self.P:
                    p = rank.mgr
                    # an ABORT is this request's when its own step sent it
                    # (the frame names the room only)
                    pending = (any(f[0] == b"ABORT" and f[1] == name and self._sender_of(f) == r
                                   and self.from_drank.get(id(f)) == drank.k
                                   for f in rank.inbox)
                               or any(f[0] == b"ABORT_ACK" and f[1] == name
                                      and self.from_rank.get(id(f)) == rank.q
                                      for f in drank.inbox))
                    # drained: the code's own predicate, the chunks its
                    # worker counted at dequeue and has not finished (mc
                    # 19:1670-1676); a new user of the room pops the count
                    # from 0.5.22 (cc 22:570-574), and then a write still at
                    # the engine brings no ack
                    missing = missing or bool(
                        room not in p._deferred_ack_poisoned_rooms
                        and not p._staging_outstanding.get(room) and rank.q not in acks
                        and not pending)
            out.append(missing)
        return out

    def next_transfer_scan(self) -> str:
        """Every decode rank's next ``pop_transferred`` on its whole transfer
        queue, as its loop runs it after the prealloc scan (dc 21:3196-3203):
        ``met``, or how the ranks failed to meet at its poll all-reduce (a
        rank whose queue is empty returns before the collective, dc
        21:2617-2618, and its peers wait)."""
        try:
            self._every_drank(lambda rank: rank.tq.pop_transferred())
        except Unmet as e:
            return f"unmet: {e}"
        except Exception as e:
            return f"error: {_error(e)}"
        return "met"

    def _sender_of(self, frame) -> Optional[int]:
        """The request whose step sent ``frame``."""
        return self.sent_by.get(id(frame), (None, None))[1]

    # ------------------------------------------------------------- settle
    def settle(self, rounds: int = 12, timeouts: bool = False) -> Dict[str, Any]:
        """Run both workers' own steps, without any timeout or client
        action, until nothing changes: every message delivered, every
        queued chunk written, every scan of both schedulers' loops run on
        its whole queue, every prefilled request forwarded and its result
        processed, every committed request decoded and answered.  What the
        liveness properties' counterexamples claim is that here some request
        stays unanswered (or held after its abort) until a timeout.
        With ``timeouts``, each round first makes every KV timeout due
        (``_due_timeouts``): what ``every-wait-bounded`` claims is that a
        request still waits when nothing is left to wait for."""
        last = self.observe()
        for k in range(1, rounds + 1):
            try:
                if timeouts:
                    self._due_timeouts()
                self._own_round()
            except Exception as e:  # a scheduler died: nobody waits any more
                return {"rounds": k, "crash": _error(e), "observation": self.observe()}
            now = self.observe()
            if now == last:
                return {"rounds": k, "crash": None, "observation": now, "quiet": True}
            last = now
        return {"rounds": rounds, "crash": None, "observation": last, "quiet": False}

    def _due_timeouts(self):
        """Every timeout the KV managers check, due now, each through the
        real code that checks it: the bootstrap timeout in each sender's
        ``poll()``, the waiting timeout in each decode rank's transfer-queue
        poll, the deferral deadline in ``resolve_deferred_releases``.  A
        request the code no longer polls (a latched receiver, a sender past
        Bootstrapping) is not timed out by this, as in the code.  The
        request-level ``SGLANG_REQ_WAITING_TIMEOUT`` (off by default) is not
        forced."""
        for r in range(self.n):
            self._try("p_bootstrap_timeout", r)
            for k in range(len(self.D)):
                self._try("d_waiting_timeout", r, {"rank": k})
        self.d_deferred_timeout(0, {})

    def _try(self, step, r, params=None):
        try:
            getattr(self, step)(r, params or {})
        except Diverged:
            pass

    def _own_round(self):
        for rank in self.P:
            for frame in [f for f in rank.inbox if f[0] != b"None"]:
                self._to_prefill(rank.q, frame)
        for rank in self.D:
            for frame in list(rank.inbox):
                self._to_decode(rank, frame)
        self._resolve_all()
        for rank in self.P:
            while not rank.worker_dead and not rank.gate.empty():
                rank.gate.dequeue()
                rank.gate.write()
        for r in range(self.n):
            step = _OWN_STEP["p"].get(_one([rank.stage(r) for rank in self.P]))
            if step:
                self._try(step, r)
            step = _OWN_STEP["d"].get(self._d_stage(r))
            if step:
                self._try(step, r)

    def _d_stage(self, r: int) -> str:
        """Request r on decode as the model's one picture of the ranks: a
        rank that let a held request go while its peers hold it (up to
        0.5.22 each rank on its own) leaves it held, and ranks whose own
        pools split an admission leave it in the prealloc queue (the model
        records who took it; ``d_ranks`` shows each rank)."""
        stages = [rank.stage(r) for rank in self.D]
        got = set(stages)
        if got == {"held", "gone"}:
            return "held"
        if got == {"prealloc", "transfer"}:
            return "prealloc"
        return _one(stages)

    def _d_view(self, r: int) -> Dict[str, Any]:
        """Request r on decode, one picture of the ranks (``_d_stage``); the
        pages are those of the ranks at the picture's stage."""
        stage = self._d_stage(r)
        at = [rank for rank in self.D if rank.stage(r) == stage] or self.D

        def each(get, ranks=self.D):
            return _one([get(rank) for rank in ranks])
        return {"stage": stage,
                "to_finish": each(lambda k: None if k.req[r] is None else _kind(k.req[r].to_finish)),
                "finished": each(lambda k: k.finished(r)),
                "pages": each(lambda k: [] if k.req[r] is None else k.pool.model_pages(k.req[r]),
                              at),
                "answer": each(lambda k: k.answer[r]), "rejected": each(lambda k: k.rejected[r]),
                "session": each(lambda k: _in_flight(k.session[r])),
                "crashed": self.crashed["d"][r],
                "latched": _reduced([_latched(k.entry(r)) for k in self.D])
                if stage == "transfer" and self._room_shared(r) else None}

    def _room_shared(self, r: int) -> bool:
        """Another request of r's room has a receiver on decode (the model
        follows a latch only there, ``kvmanager.room_shared_on_decode``)."""
        return any(v != r and self.rooms[v] == self.rooms[r]
                   and self._d_stage(v) in ("prealloc", "transfer", "held")
                   for v in range(self.n))

    def _p_view(self, r: int) -> Dict[str, Any]:
        """Request r on prefill, as one picture of its ranks: a field the
        ranks disagree on reads ``split:...`` (the model keeps one value)."""
        def each(get):
            return _one([get(rank) for rank in self.P])
        return {"stage": each(lambda k: k.stage(r)),
                "to_finish": each(lambda k: None if k.req[r] is None else _kind(k.req[r].to_finish)),
                "finished": each(lambda k: k.finished(r)),
                "answer": each(lambda k: k.answer[r]), "rejected": each(lambda k: k.rejected[r]),
                "session": each(lambda k: _in_flight(k.session[r])),
                "crashed": self.crashed["p"][r]}

    def observe(self) -> Dict[str, Any]:
        out = {"p": [], "d": [], "p_room": [], "d_room": [], "p_drain": []}
        several = len(self.D) > 1
        if several:
            out["d_ranks"] = []
        for r in range(self.n):
            out["p"].append(self._p_view(r))
            out["d"].append(self._d_view(r))
            if several:
                out["d_ranks"].append([rank.stage(r) for rank in self.D])
            room = self.rooms[r]
            rooms = [kvadapter.poll_name(rank.mgr.request_status.get(room)) for rank in self.P]
            out["p_room"].append(rooms[0] if len(rooms) == 1 else rooms)
            # _staging_outstanding and _deferred_ack_poisoned_rooms (0.5.22+)
            drain = [[rank.mgr._staging_outstanding.get(room, 0),
                      room in getattr(rank.mgr, "_deferred_ack_poisoned_rooms", ())]
                     for rank in self.P]
            out["p_drain"].append(drain[0] if len(drain) == 1 else drain)
            # the scans act on the MIN over the ranks of the entries they
            # still have (a rank that let the room go has none)
            polls = [rank.mgr.request_status.get(self.rooms[r]) for rank in self.D]
            polls = [p for p in polls if p is not None]
            out["d_room"].append(kvadapter.poll_name(min(polls)) if polls else None)
        pool = self.D[0].pool
        out["writers"] = [_one([rank.pool.writer(p) for rank in self.D])
                          for p in range(pool.pages)]
        return out


# the step each scheduler takes next for a request at each stage, in its own
# loop (``Rig.settle``)
_OWN_STEP = {"p": {"door": "p_door", "bootstrap": "p_pop_bootstrapped", "waiting": "p_forward",
                   "forwarded": "p_result", "inflight": "p_inflight"},
             "d": {"door": "d_door", "prealloc": "d_prealloc", "transfer": "d_transferred",
                   "waiting": "d_attend", "running": "d_respond"}}


def _in_flight(session) -> bool:
    """The streaming session's in-flight mark (``Session._inflight``)."""
    return bool(session is not None and session._inflight)


def _end_session_turn(req) -> None:
    """What ``release_kv_cache`` does to a streaming session's request that
    holds KV, which the rig's own release stands in for: ``finish_req`` or,
    for an abort, ``abort_req`` (0.5.19/0.5.20 ``cache_finished_req`` ->
    ``try_cache_finished_req``, SS 19:298/319; 0.5.21+ through
    ``claim_kv_row``, SS 21:303/324, 23:173/190); without KV the real call
    returns before it (memc 19:257, 23:405)."""
    session = getattr(req, "session", None)
    if session is None or not session.streaming or req.kv.req_pool_idx is None:
        return
    if isinstance(req.finished_reason, sb.FINISH_ABORT):
        session.abort_req()
    else:
        session.finish_req(req)


def _rid_in(reqs: List[Any], req) -> Optional[int]:
    return next((r for r, x in enumerate(reqs) if x is req), None)


def _slices(writer) -> List[Optional[int]]:
    """A decode page's writer per prefill rank's heads."""
    return writer if isinstance(writer, list) else [writer]


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
         "p_bootstrap_timeout", "p_req_waiting_timeout", "xfer_fail", "xfer_stray_lands",
         "d_retract", "d_resume",
         "d_waiting_timeout", "d_prealloc_splits", "d_handshake", "xfer_session_failed",
         "p_probe_failed_sessions", "d_drop_late_status", "p_dies", "d_node_failure",
         "d_heartbeat_lost", "d_fetch_prefill_info", "d_fetch_fails", "xfer_worker_raises",
         "p_resolve_waiting", "d_transfer_poll")


def _latched(entry) -> Optional[str]:
    """What a transfer-queue entry's receiver latched, Success or Failed."""
    recv = None if entry is None else entry.kv_receiver
    got = kvadapter.poll_name(None if recv is None else getattr(recv, "conclude_state", None))
    return got if got in ("Success", "Failed") else None


def _reduced(latched: List[Optional[str]]) -> Optional[str]:
    """The ranks' latches as the MIN-reduced poll acts on them: Failed if a
    rank latched Failed, Success if every rank latched Success."""
    if "Failed" in latched:
        return "Failed"
    return "Success" if latched and all(x == "Success" for x in latched) else None


def _poll_senders(reqs) -> None:
    """The poll at the head of ``pop_bootstrapped`` and of the inflight
    scan: every request's sender's ``poll()``, which latches a Success or
    Failed it reads."""
    for req in reqs:
        sender = getattr(req, "disagg_kv_sender", None)
        if sender is not None:
            sender.poll()


def _poll_queue(entries) -> None:
    """The poll at the head of ``pop_transferred``: every entry's receiver's
    ``poll()``, in queue order, which latches a Success or Failed it reads
    (the rig then runs the call on the stepped entry alone, ``_only``)."""
    for e in entries:
        if e.kv_receiver is not None:
            e.kv_receiver.poll()


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
            before = len(rig.writes)
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
            for f in rig._p_inboxes() + rig._d_inboxes():
                rig.sent_by.setdefault(id(f), (f, r))
            observations.append(rig.observe())
            landed = sorted({p for rank in rig.D
                             for p in rank.pool.pages_at([d for _, d, _ in rig.writes[before:]])})
        final = rig.final(landed)
        if stop is None and len(rig.D) > 1 and trace["steps"][-1]["action"] == "d_prealloc_splits":
            final["next_transfer_scan"] = rig.next_transfer_scan()
        if stop is None and trace.get("settle"):
            final["settled"] = rig.settle(timeouts=trace["settle"] == "timed")
    for rank in rig.P:
        rank.gate.close()
    return {"observations": observations, "stop": stop, "final": final}
