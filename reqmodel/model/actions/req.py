"""Operations on one ``Req`` that several actions share: releasing its KV
and metadata, streaming its answer, promoting a pending abort, intake
validation and the door's retire cleanup.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Optional, Tuple

from reqmodel.model.events import Crash, Release, Stream
from reqmodel.model.actions.core import Ctx, Event, SchedulerDied, set_d, set_p
from reqmodel.model.state import ABORT_400, Finish, State


def p_release_kv(c: Ctx, s: State, r: int, unconditional: bool) -> Tuple[State, Tuple[Event, ...]]:
    """``release_kv_cache`` on P (memc 254/276/292/378/400).  An unconditional
    call on a request that holds no KV asserts ``tree_cache.supports_mamba()``
    ("Only MambaRadixCache allow freeing before alloc", memc 19:257-260,
    20:279-282, 21:297-300, 22:383-386, 23:405-408): with a tree cache that
    keeps no Mamba state the AssertionError stops the prefill scheduler."""
    req = s.p[r]
    held = req.holds_kv or req.holds_mamba
    evs: Tuple[Event, ...] = (Release(r, "prefill", "kv", held),) if (held or unconditional) else ()
    if unconditional and not req.holds_kv and not c.scenario.hybrid_mamba:
        raise SchedulerDied(set_p(s, r, crashed=True), evs + (
            Crash(r, "prefill", "AssertionError", "release_kv_cache",
                  "the request holds no KV and the tree cache keeps no Mamba state"),))
    return set_p(s, r, kv_pages=0, holds_mamba=False), evs


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
