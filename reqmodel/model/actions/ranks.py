"""Decode's ranks deciding alone.

Each decode TP rank runs its own scheduler loop over its own prealloc and
transfer queues and its own allocators, and meets its peers at the poll
all-reduces.  The model keeps one picture of the ranks in lockstep
(``State.d_pages``) and records, per request, the ranks that have already
freed its pages while others hold them (``DecodeReq.released_on``).  Where
a rank's own pool then answers an admission differently from its peers',
the step here takes the split and records it (``DecodeReq.split``): the
ranks' queues differ from that point, and the model follows them no
further (``State.halted``; notes/design.md, "Decode's ranks: one picture,
and where it splits")."""
from __future__ import annotations

from typing import Tuple

from reqmodel.model.actions.core import action, Ctx, Effect, Needs, set_d
from reqmodel.model.actions.decode import (_dropped, _prealloc_need, _radix_hit_possible,
                                           _scanned, drop_scanned, handshake_raises)
from reqmodel.model.actions.dpool import retracted_reserve
from reqmodel.model.actions.kvmanager import all_ranks
from reqmodel.model.events import RanksSplit
from reqmodel.model.state import DStage, KVPoll, State


def rank_split(c: Ctx, s: State, low: int, high: int, slot: bool
               ) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Decode's ranks that would take a request needing ``high`` pages (and a
    metadata slot, with ``slot``) from their own pools, and those that could
    not take it even with ``low``; each rank's allocator answers alone
    (``available_size()`` of its own metadata and token pools, dc 21:1352,
    1379, 1465-1494).  Both empty, or one of them empty, while the ranks'
    pools are one picture (no request's pages are freed on some ranks only)."""
    if c.scenario.decode.ranks == 1 or not any(d.released_on for d in s.d):
        return (), ()
    reserve = retracted_reserve(s)
    took, kept = [], []
    for k in all_ranks(c):
        free = len(s.rank_free_pages(k)) - reserve
        has_slot = not slot or s.rank_free_slots(k) > 0
        if free >= high and has_slot:
            took.append(k)
        elif free < low or not has_slot:
            kept.append(k)
    return tuple(took), tuple(kept)


def _prealloc_splits(c, s, r):
    """As ``_can_prealloc``, but the ranks' own pools answer differently:
    some have the pages and a slot back from a hold their peers keep."""
    req = s.d[r]
    if not (req.stage is DStage.PREALLOC and req.receiver_state is KVPoll.WaitingForInput):
        return False
    hit = 1 if _radix_hit_possible(c, req) else 0
    took, kept = rank_split(c, s, _prealloc_need(c, req, hit), _prealloc_need(c, req, 0), True)
    return bool(took and kept) and not _scanned(c, s, r) and handshake_raises(c, s) is None


@action("decode", guard=_prealloc_splits, needs=Needs(d={DStage.PREALLOC}))
def d_prealloc_splits(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D2 ``pop_preallocated`` on every decode rank of the attention-TP group,
    each deciding admission from its own allocators (dc 19:1080+, 21:1339-1494,
    23:1333+): the ranks that freed a held request's pages take this one into
    their transfer queue, the ranks still holding them ``break`` and keep it
    in the prealloc queue.  ``process_decode_queue`` goes straight on to
    ``pop_transferred`` (dc 19:2686-2692, 21:3196-3203, 23:3482-3489), whose
    poll all-reduce is the ranks' next meeting: one rank enters it with the
    request and its peers with a shorter queue or not at all.  A peer whose
    transfer queue is empty returns before the collective (dc 21:2617-2618)
    and goes on to the next iteration's intake broadcast on the same gloo
    group (rr 21:211): neither call matches the other, and both ranks wait
    until the CPU group's timeout, after which the scheduler dies; with
    other requests in both queues the lengths differ and gloo aborts the
    process (#26394 and #36928 name the family).  The model follows one
    picture of the ranks and stops here (``State.halted``)."""
    hit = 1 if _radix_hit_possible(c, s.d[r]) else 0
    req = s.d[r]
    took, kept = rank_split(c, s, _prealloc_need(c, req, hit), _prealloc_need(c, req, 0), True)
    s, dropped = drop_scanned(c, s, _dropped(c, s))  # the call's drops come first
    s = set_d(s, r, split=took)
    return s, dropped + (RanksSplit(r, "decode", "pop_preallocated", took, kept),)
