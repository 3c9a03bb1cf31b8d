"""The client's abort, as each worker's scheduler handles it.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Tuple

from reqmodel.model import guards as g
from reqmodel.model.actions.core import action, Ctx, Effect, Event, Needs, set_d, set_p
from reqmodel.model.events import Release
from reqmodel.model.actions.drelease import d_release
from reqmodel.model.actions.kvmanager import (all_ranks, arm_tracker, notify_abort, receiver_fail,
                                              sender_abort)
from reqmodel.model.actions.prefill import loop_timing
from reqmodel.model.actions.req import p_free_metadata, p_release_kv, stream_d, stream_p
from reqmodel.model.state import DStage, KVPoll, PStage, replace, State


def _reaches(c: Ctx, worker: str) -> bool:
    """The client's abort reaches this worker's tokenizer manager at all
    (``[options] client_abort_reaches``)."""
    return c.scenario.client_abort_reaches in ("both", worker)


def _p_abortable(c, s, r):
    req = s.p[r]
    if not _reaches(c, "prefill") or s.aborted_by_client[r]:
        return False
    if req.stage is PStage.YIELDED:
        # a yield (process_prefill_chunk) and the request's middle result are
        # handled in the same loop iteration; aborts are read only at its top
        return not loop_timing(c)
    return req.stage in (PStage.BOOTSTRAP, PStage.WAITING, PStage.CHUNKED,
                         PStage.FORWARDED, PStage.INFLIGHT)


def _aborted_at_decode(c, s, r):
    """The client has aborted: its abort reached decode.  With
    ``client_abort_reaches = "both"`` the router drops both connections when
    the client goes, so prefill's tokenizer manager aborts the request too:
    its abort is no new choice of the environment."""
    return s.d[r].client_aborted


def _aborted_at_prefill(c, s, r):
    return s.aborted_by_client[r]


@action("client", guard=_p_abortable,
        needs=Needs(p={PStage.YIELDED, PStage.BOOTSTRAP, PStage.WAITING, PStage.CHUNKED,
                       PStage.FORWARDED, PStage.INFLIGHT}),
        event="client_abort", worker="prefill",
        follows=_aborted_at_decode)
def p_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``abort_request`` on P (sch 19:4966-5114, 20:5217-5371, 21:5447-5585,
    22:5458-5600, 23:5675-5813; the same lists on every release): ``chunked_req``
    is marked for ``process_pending_chunked_abort``; method 1 pops a waiting
    request; the bootstrap and inflight queues abort the sender
    (``handle_*_failure`` follows at the next poll); method 3 sets
    ``to_finish`` on unfinished requests of ``running_batch`` and
    ``last_batch`` (``collect_inflight_reqs``).  Every stage the guard admits
    is in one of them (a yielded request only under the event loop's order:
    it is requeued in the iteration that yields it).  From 0.5.22 the
    bootstrap and waiting queues' branches call ``_release_aborted_request``,
    which ends a streaming session's turn (``release_aborted_clears_session``)."""
    req = s.p[r]
    s = replace(s, aborted_by_client=s.aborted_by_client[:r] + (True,) + s.aborted_by_client[r + 1:])
    s = set_p(s, r, abort_reached=True)
    if c.release.release_aborted_clears_session and req.stage in (PStage.WAITING, PStage.BOOTSTRAP):
        s = set_p(s, r, session_slot=False)
    evs: Tuple[Event, ...] = ()
    if req.stage is PStage.WAITING:  # method 1
        if c.release.p_waiting_abort_releases_all or req.pending_bootstrap:
            s = sender_abort(c, s, r)
        if c.release.p_waiting_abort_releases_all:
            s, evs = p_release_kv(c, s, r, unconditional=False)
        s = set_p(p_free_metadata(s, r), r, stage=PStage.GONE, finished_reason=c.abort_status,
                  pending_bootstrap=False if c.release.p_waiting_abort_releases_all
                  else req.pending_bootstrap, cache_handle=False)
        s, ev2 = stream_p(s, r, c.abort_status)
        return s, evs + ev2
    if req.stage in (PStage.BOOTSTRAP, PStage.INFLIGHT):
        if c.release.handoff_abort_keeps_verdict:  # a proposal: the abort's own verdict
            s = set_p(s, r, finished_reason=c.abort_status)
        return sender_abort(c, s, r), ()
    if req.stage is PStage.CHUNKED:
        s = set_p(s, r, pending_chunked_abort=True)
    if req.results_due and not g.finished(s.p[r]):  # method 3: in last_batch
        s = set_p(s, r, to_finish=c.abort_status)
    return s, ()


def _held_for_rebootstrap(req) -> bool:
    """Retracted by ``pause_generation(mode="retract")`` and held in
    ``held_rebootstrap_reqs`` until ``continue_generation`` (dc 19:712-730,
    21:848-867): the door with the rebootstrap flag is that hold."""
    return req.stage is DStage.DOOR and req.door_flag == "rebootstrap"


def _d_abortable(c, s, r):
    req = s.d[r]
    if not _reaches(c, "decode"):
        return False
    return not req.client_aborted and (req.stage in (
        DStage.PREALLOC, DStage.TRANSFER, DStage.WAITING, DStage.RUNNING, DStage.RETRACTED)
        or _held_for_rebootstrap(req))


@action("client", guard=_d_abortable,
        needs=Needs(d={DStage.PREALLOC, DStage.TRANSFER, DStage.WAITING, DStage.RUNNING,
                       DStage.RETRACTED, DStage.DOOR}),  # DOOR: held for rebootstrap
        event="client_abort", worker="decode",
        follows=_aborted_at_prefill)
def d_abort(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``abort_request`` on D (same lines as ``p_abort``): prealloc and transfer
    queues call ``receiver.abort()`` (cc 1626/1857/2016/2552/2955: Failed,
    ABORT sent to P); the waiting queue is method 1 (release KV); a running
    request gets method 3 (``to_finish``); the retracted queue discards the
    host backup.  No release scans ``held_rebootstrap_reqs``: an abort for a
    request paused for rebootstrap finds it in no list and is lost (the
    tokenizer manager sends it once), and on ``continue_generation`` the
    request is re-added with ``is_rebootstrap=True`` as if never aborted."""
    req = s.d[r]
    s = set_d(s, r, client_aborted=True)
    if _held_for_rebootstrap(req):
        return s, ()
    if req.stage in (DStage.PREALLOC, DStage.TRANSFER):
        if c.release.handoff_abort_keeps_verdict:  # a proposal: the abort's own verdict
            s = set_d(s, r, finished_reason=c.abort_status)
        s = set_d(receiver_fail(c, s, r), r, receiver_state=KVPoll.Failed)
        published = req.stage is DStage.TRANSFER  # init_time set: metadata sent
        if c.release.arm_before_send:
            return notify_abort(c, s, r, all_ranks(c), arm=published), ()
        s = notify_abort(c, s, r, all_ranks(c), arm=False)
        if published and c.deferred:  # sch 19:5067-5085: arm after send, a fresh set
            for k in s.d[r].notified:
                s = arm_tracker(c, s, r, k, 0)
        return s, ()
    if req.stage is DStage.WAITING:
        s = set_d(d_release(c, s, r), r, stage=DStage.GONE, finished_reason=c.abort_status,
                  cache_handle=False)
        return stream_d(s, r, c.abort_status)
    if req.stage is DStage.RETRACTED:  # discard_kv_cache_backup, then the abort
        s = set_d(s, r, stage=DStage.GONE, retraction_backup=False,
                  finished_reason=c.abort_status, cache_handle=False)
        s, evs = stream_d(s, r, c.abort_status)
        return s, (Release(r, "decode", "backup", req.retraction_backup),) + evs
    return set_d(s, r, to_finish=c.abort_status), ()


def _p_waited_too_long(c, s, r):
    return (c.release.req_waiting_timeout and s.p[r].stage is PStage.WAITING
            and not s.aborted_by_client[r])


@action("prefill", guard=_p_waited_too_long,
        needs=Needs(p={PStage.WAITING}), event="req_waiting_timeout")
def p_req_waiting_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``SGLANG_REQ_WAITING_TIMEOUT`` on prefill (off by default, env
    21:634): ``_poll_timeout_aborts`` (sch 20:3304, 21:3379-3401,
    22:3471, 23:3598-3620) finds the request in the waiting queue past its
    deadline (``wait_queue_entry_time``, set when ``pop_bootstrapped`` moves
    it there, pf 21:521/534) and hands an ``AbortReq`` (503, "Request
    waiting timeout reached.") to this worker's own ``abort_request``: the
    client's abort, reaching prefill only (``p_abort``).  Decode hears
    nothing.  An operator's deadline, not the deployment's progress: an
    environment step, like the client's abort."""
    return p_abort(c, s, r)


def _d_waited_too_long(c, s, r):
    return (c.release.req_waiting_timeout and s.d[r].stage is DStage.WAITING
            and not s.d[r].client_aborted)


@action("decode", guard=_d_waited_too_long,
        needs=Needs(d={DStage.WAITING}), event="req_waiting_timeout")
def d_req_waiting_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``SGLANG_REQ_WAITING_TIMEOUT`` on decode: the same
    ``_poll_timeout_aborts`` for a committed request in decode's waiting
    queue (``wait_queue_entry_time`` set at commit, dc 21:2574), handled by
    decode's ``abort_request`` as ``d_abort`` (method 1: pages released,
    503 streamed).  Prefill has already answered."""
    return d_abort(c, s, r)
