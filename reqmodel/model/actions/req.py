"""Operations on one ``Req`` that several actions share: releasing its KV
and metadata, streaming its answer, promoting a pending abort, intake
validation and the door's retire cleanup.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Optional, Tuple

from reqmodel.model.events import Crash, Release, Stream
from reqmodel.model.actions.core import Ctx, Event, SchedulerDied, set_d, set_p
from reqmodel.model.state import ABORT_400, ABORT_500, Finish, State


def p_release_kv(c: Ctx, s: State, r: int, unconditional: bool) -> Tuple[State, Tuple[Event, ...]]:
    """``release_kv_cache`` on P (memc 254/276/292/378/400).  An unconditional
    call on a request that holds no KV asserts ``tree_cache.supports_mamba()``
    ("Only MambaRadixCache allow freeing before alloc", memc 19:257-260,
    20:279-282, 21:297-300, 22:383-386, 23:405-408): with a tree cache that
    keeps no Mamba state the AssertionError stops the prefill scheduler.
    Releasing KV a streaming session's request holds ends its turn
    (``session_turn_ends``)."""
    req = s.p[r]
    held = req.holds_kv or req.holds_mamba
    evs: Tuple[Event, ...] = (Release(r, "prefill", "kv", held),) if (held or unconditional) else ()
    if unconditional and not req.holds_kv and not c.scenario.hybrid_mamba:
        raise SchedulerDied(set_p(s, r, crashed=True), evs + (
            Crash(r, "prefill", "AssertionError", "release_kv_cache",
                  "the request holds no KV and the tree cache keeps no Mamba state"),))
    return set_p(s, r, kv_pages=0, holds_mamba=False, **session_turn_ends(req)), evs


def session_turn_ends(req) -> dict:
    """The streaming session's in-flight mark (``Session._inflight``, set by
    ``create_req``, SC 19:329/20:343/21:344/22:344/23:349) is cleared by
    ``finish_req`` / ``abort_req`` only, and on every release the one call
    that reaches them for a request's end is ``release_kv_cache`` on a
    request holding KV: 0.5.19/0.5.20 through ``cache_finished_req`` ->
    ``try_cache_finished_req`` (SS 19:298/319, 20:304/325; memc 19:270,
    20:292), 0.5.21+ through ``claim_kv_row`` (memc 21:308; SS 21:303/324,
    22:165/182, 23:173/190).  ``release_kv_cache`` returns before that when
    the request holds no KV (memc 19:257, 20:279): a request that ends
    without KV keeps the mark set.  The door's retire (``run_retire_cleanup``)
    and 0.5.22's ``_release_aborted_request`` clear it too."""
    return dict(session_slot=False) if req.holds_kv else {}


def failure_reason(ctx: Ctx, req) -> Finish:
    """The verdict a failure path sets: ``prepare_abort(..., 500)``, which
    overwrites an abort verdict the request already carries on every
    release's bootstrap-failure and transfer-failure paths (pf 21:1204,
    dc 21:2665-2710); with the proposal field ``handoff_abort_keeps_verdict``
    the abort's own verdict stays, as prefill's inflight failure path and
    decode's prealloc drop already keep it (pf 21:1137, dc 21:1057)."""
    kept = req.finished_reason
    if ctx.release.handoff_abort_keeps_verdict and kept is not None and kept.is_abort:
        return kept
    return ABORT_500


def session_turn_aborted(ctx: Ctx) -> dict:
    """An exit that ends a request without ``release_kv_cache`` (decode's
    prealloc drop, ``handle_bootstrap_failure``, the doors' capacity
    rejections) calls the session's ``abort_req`` only where the release
    record says so (``exits_abort_session_turn``: no release does; the
    proposal ``session-abort-on-every-exit`` does, as
    ``retire_unadmitted_request`` does at the door, sch 21:3244-3248)."""
    return dict(session_slot=False) if ctx.release.exits_abort_session_turn else {}


def p_free_metadata(s: State, r: int) -> State:
    """``maybe_release_metadata_buffer`` (pf 115/123/139/144/157): idempotent."""
    return set_p(s, r, holds_metadata=False)


def stream_p(s: State, r: int, reason: Finish) -> Tuple[State, Tuple[Event, ...]]:
    """``stream_output`` of prefill's final answer for ``reason``: the first
    one's status is what the client (through the router) gets."""
    req = s.p[r]
    s = set_p(s, r, answer=reason.status if req.answer is None else req.answer)
    return s, (Stream(r, "prefill", reason.status, reason.cause),)


def stream_d(s: State, r: int, reason: Finish,
             own: Optional[bool] = None) -> Tuple[State, Tuple[Event, ...]]:
    """``stream_output`` of decode's final answer for ``reason``."""
    req = s.d[r]
    if req.answer is None:
        s = set_d(s, r, answer=reason.status, own_data=own)
    return s, (Stream(r, "decode", reason.status, reason.cause),)


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
