"""Intake: the tokenizer manager hands a request to each worker's scheduler.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Tuple

from reqmodel.model import processes
from reqmodel.model.actions.core import (action, BY_NAME, Ctx, Effect, Event, HISTORY, Needs,
                                         set_d, set_p)
from reqmodel.model.actions.req import validate_intake
from reqmodel.model.events import Stream
from reqmodel.model.state import DStage, PStage, State


def _answered(c: Ctx, s: State, prev: int) -> bool:
    """The client has every answer the next user of ``prev``'s room waits
    for: decode's, and prefill's too unless ``reuse_room_after = "decode"``."""
    return s.d[prev].answer is not None and (
        c.scenario.reuse_room_after != "both" or s.p[prev].answer is not None)


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
    return _answered(c, s, prev)


def inflight_scan_due(c: Ctx, s: State, r: int) -> bool:
    """Prefill's next inflight scan (``process_disagg_prefill_inflight_queue``)
    acts on request ``r``: one of the steps of that phase is enabled for it."""
    return s.p[r].stage is PStage.INFLIGHT and any(
        BY_NAME[a].guard(c, s, r) for a in _INFLIGHT_STEPS)


_INFLIGHT_STEPS = processes.actions_of_phase("inflight")


def note_client_waits(c: Ctx, s: State, nxt: State, evs: Tuple[Event, ...]) -> State:
    """History for the prefill loop's order (``processes.PREFILL_LOOP``): at
    the step that gives the client the last answer the next user of a room
    waits for, record whether prefill's inflight scan was then due for the
    earlier user.  Only a step that streams an answer can change it."""
    sc = c.scenario
    if not sc.shares_rooms or sc.room_users == "concurrent":
        return nxt
    for ev in evs:
        if isinstance(ev, Stream) and not _answered(c, s, ev.rid) and _answered(c, nxt, ev.rid):
            due = inflight_scan_due(c, nxt, ev.rid)
            if due != nxt.p[ev.rid].scan_due_when_answered:
                nxt = set_p(nxt, ev.rid, scan_due_when_answered=due)
    return nxt


HISTORY.append(note_client_waits)


def _ingest_after_inflight_scan(c: Ctx, s: State, r: int) -> bool:
    """The prefill loop runs its inflight scan, then comes back to its intake
    waiting for no other process (``processes.PREFILL_LOOP``, pf 21:702-705
    and 21:754-762 then 21:673, each release alike).  A request sent only after
    the client had the answers for the earlier user of its room needed a
    round trip through decode and the client; if prefill's inflight scan was
    already due for that earlier user then, the scan comes first: the loop
    takes the new request in only after the scan acted on the earlier one
    (notes/design.md, "Processes and timing assumptions").  Not assumed of a
    paused prefill or of 0.5.22+'s continuous input polling, which skip the
    scan; the model runs neither."""
    prev = c.scenario.previous_user(r)
    if prev is None or c.scenario.room_users == "concurrent":
        return True
    return not (s.p[prev].scan_due_when_answered and inflight_scan_due(c, s, prev))


def _absent_p(c, s, r):
    return (s.p[r].stage is PStage.ABSENT and _room_free_for(c, s, r)
            and _ingest_after_inflight_scan(c, s, r))


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
