"""Decode's release of a request's pages and metadata slot, and the deferred
release of a failed request's hold (``resolve_deferred_releases`` ->
``_do_release``): the steps of decode's scheduler call these, none is an
action of its own.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Optional, Tuple

from reqmodel.model.actions.core import Ctx, Effect, set_d
from reqmodel.model.actions.kvmanager import d_room_of, receiver_clear, release_safe, set_d_room
from reqmodel.model.actions.req import session_turn_ends
from reqmodel.model.events import AckRelease, RankRelease, Release
from reqmodel.model.state import DRoom, DStage, MetaSlot, replace, State


def clear_checksum(c: Ctx, slot: MetaSlot) -> Optional[Tuple]:
    """The checksum row a freed metadata slot keeps: 0.5.21/0.5.22 leave the last
    owner's (only ``bootstrap_room[idx] = 0``), 0.5.23's ``clear_slot`` zeroes it
    (ut 23:517-522)."""
    return None if c.release.clear_slot_resets_checksum else slot.checksum


def d_release(c: Ctx, s: State, r: int) -> State:
    """Free the request's D pages and metadata slot (``release_kv_cache`` on D and
    the slot reset; ``_do_release`` dc 2390/2477/2791/2909/3018 for held ones).
    The reset zeroes ``bootstrap_room[idx]`` and, from 0.5.23, the checksum row
    (``clear_slot``, dc 23:2987/3024)."""
    req = s.d[r]
    pages = list(s.d_pages)
    for pg in req.pages:
        pages[pg] = replace(pages[pg], owner=None)
    slots = list(s.d_slots)
    if req.meta_slot >= 0:
        slot = slots[req.meta_slot]
        slots[req.meta_slot] = replace(slot, owner=None, room=0, checksum=clear_checksum(c, slot))
    s = replace(s, d_pages=tuple(pages), d_slots=tuple(slots))
    if req.has_receiver:
        s = receiver_clear(c, s, r)
    return set_d(s, r, pages=(), meta_slot=-1, has_receiver=False, **session_turn_ends(req))


def resolve_held(c: Ctx, s: State, r: int, tracker: Optional[DRoom] = None) -> Effect:
    """``resolve_deferred_releases`` (dc 19:2405-2436 ... 23:3046-3090): a rank
    whose tracker for the room has an ack from every prefill rank it
    bootstrapped from releases its hold (``is_abort_release_safe(room,
    required_acks)``, ``required_acks = len(bootstrap_infos)``, dc
    19:2416, 22:2894-2898; the tracker is the room's, whoever armed it).  Up
    to 0.5.22 each rank decides alone; 0.5.23 MIN-reduces readiness, so the
    ranks release together.  The pool is one picture of every rank's pool in
    lockstep: its pages free when the last rank lets go; until then
    ``released_on`` names the ranks whose own pool has them back
    (``State.rank_free_pages``), which ``pop_preallocated`` reads
    (``ranks.d_prealloc_splits``)."""
    req = s.d[r]
    if req.stage is not DStage.HELD:
        return s, ()
    if tracker is None:
        tracker = d_room_of(c, s, r)
    ready = tuple(k for k in req.held if release_safe(c, tracker, k))
    if not ready or (c.release.release_reduced and len(ready) < len(req.held)):
        return s, ()
    # history: whose ABORT the acks that free this hold answered
    evs = (AckRelease(r, "decode", tuple(sorted({o for k, _, o in tracker.acked if k in ready}))),)
    held = tuple(k for k in req.held if k not in ready)
    if held:
        freed = tuple(sorted(req.released_on + ready))
        return set_d(s, r, held=held, released_on=freed), evs + (RankRelease(r, "decode", ready),)
    s, ev2 = do_release(c, s, r, on_ack=True)
    return s, evs + ev2


def do_release(c: Ctx, s: State, r: int, on_ack: bool) -> Effect:
    """``_do_release`` (dc 2390/2477/2791/2909/3018): the held pages and slot are
    freed on every rank still holding, and ``clear_deferred_abort_state(room)``
    pops the room's drain-ack tracker, whoever armed it."""
    on_ack = on_ack and not s.d[r].deadline_passed
    s = set_d(d_release(c, s, r), r, stage=DStage.GONE, held=(), released_on=(),
              released_on_ack=on_ack, cache_handle=False)
    s = set_d_room(c, s, r, armed=(), acked=())
    return s, (Release(r, "decode", "kv", True),)
