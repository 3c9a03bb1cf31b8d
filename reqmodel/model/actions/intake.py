"""Intake: the tokenizer manager hands a request to each worker's scheduler.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from reqmodel.model.actions.core import action, Ctx, Effect, Needs, set_d, set_p
from reqmodel.model.actions.req import validate_intake
from reqmodel.model.state import DStage, PStage, State


def _room_free_for(c: Ctx, s: State, r: int) -> bool:
    """A request that reuses a ``bootstrap_room`` (``GenerateReqInput.bootstrap_room``
    is the client's to set) is sent once the room's previous user has its
    answer: from both workers, or from decode alone (``reuse_room_after``).
    Concurrent users (``room_users``) are sent whenever: the samples of an
    n > 1 request are sent one after another without waiting, each a copy of
    its prompt's object with the prompt's room (tm 19:1889-1891,
    20:2017-2019, 21:2038-2040, 22:2164-2166, 23:2165-2167), and each
    server's tokenizer does this on its own."""
    prev = c.scenario.previous_user(r)
    if prev is None or c.scenario.room_users == "concurrent":
        return True
    both = c.scenario.reuse_room_after == "both"
    return s.d[prev].answer is not None and (not both or s.p[prev].answer is not None)


def _absent_p(c, s, r):
    return s.p[r].stage is PStage.ABSENT and _room_free_for(c, s, r)


@action("client", guard=_absent_p, needs=Needs(p={PStage.ABSENT}), worker="prefill", seam="intake")
def p_intake(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Intake on prefill: ``handle_generate_request`` (sch 2586/2724/2749/2820/2943)
    validates the prompt against P's limit, then ``_add_request_to_queue``
    (sch 3018/3193/3266/3353/3480) dispatches it to the bootstrap door."""
    sc = c.scenario
    fields = validate_intake(sc.prefill, sc.prompt_pages[r])
    s = set_p(s, r, stage=PStage.DOOR, session_slot=sc.sessions,
              cache_handle=c.release.has_cache_handle,
              requeues_left=sc.optimistic_prefill_attempts, **fields)
    return s, ()


def _absent_d(c, s, r):
    return s.d[r].stage is DStage.ABSENT and _room_free_for(c, s, r)


@action("client", guard=_absent_d, needs=Needs(d={DStage.ABSENT}), worker="decode", seam="intake")
def d_intake(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """Intake on decode: ``handle_generate_request`` (sch 2586/2724/2749/2820/2943)
    validates against D's own ``max_req_input_len`` (tp_worker.py 19:542-556),
    then ``_add_request_to_queue`` (sch 3018/3193/3266/3353/3480) dispatches to
    ``DecodePreallocQueue.add`` with ``is_retracted=False``."""
    sc = c.scenario
    fields = validate_intake(sc.decode, sc.prompt_pages[r])
    s = set_d(s, r, stage=DStage.DOOR, session_slot=sc.sessions,
              cache_handle=c.release.has_cache_handle, **fields)
    return s, ()
