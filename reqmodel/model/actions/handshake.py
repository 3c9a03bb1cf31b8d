"""Decode's handshake poll as its own step, where the release's handshake can
skip its poll.

``pop_preallocated`` starts with ``_update_handshake_waiters``, which polls
every receiver of the prealloc queue and marks the entries whose poll read
WaitingForInput (``waiting_for_input``, dc 19:894-901).  On 0.5.19 it skips
the poll while every entry is marked and none concluded Failed (dc
19:871-880), so whether a scan polls depends on whether an earlier scan has
marked every entry.  ``d_prealloc`` and ``d_prealloc_drop`` mark them too (the
same call); this step is a scan whose handshake marks entries while the call
admits and drops nothing.  Elsewhere (0.5.20 on) the handshake always polls
and no step here is enabled.

The transfer scan's counterpart: ``pop_transferred`` polls its whole queue
too and latches every Success or Failed it reads (notes/design.md, "A
scan's poll latches its whole queue"); ``d_transfer_poll`` is a call that
latches a Success the metadata gate holds back and hands nothing on.
"""
from __future__ import annotations

from reqmodel.model.actions.core import action, Ctx, Effect, Needs
from reqmodel.model.actions.decode import (_can_prealloc, _handshake_polls, _scanned, handshake,
                                           handshake_raises, transfer_poll, unmarked)
from reqmodel.model.actions.kvmanager import (d_room_of, latch_transfer_queue,
                                              receiver_unlatched, room_shared_on_decode,
                                              transfer_poll_raises)
from reqmodel.model.state import DStage, KVPoll, State


def _can_skip(release) -> bool:
    """The release's handshake may skip its poll (its record)."""
    return not release.handshake_polls_waiting


def _marks(c, s, r):
    """The handshake would mark an entry (r, the first such, stands for the
    scan), it raises nothing, and the call drops and admits nothing (a call
    that would is ``d_prealloc_drop`` or ``d_prealloc``, which mark too)."""
    if not _can_skip(c.release) or not unmarked(c, s, r):
        return False
    if any(unmarked(c, s, u) for u in range(r)):
        return False
    queued = [u for u, d in enumerate(s.d) if d.stage is DStage.PREALLOC]
    return (_handshake_polls(c, s) and handshake_raises(c, s) is None
            and not any(_scanned(c, s, u) or _can_prealloc(c, s, u) for u in queued))


@action("decode", guard=_marks, needs=Needs(d={DStage.PREALLOC}), releases=_can_skip)
def d_handshake(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D2 ``pop_preallocated`` whose handshake polls the prealloc queue
    (``poll_and_all_reduce``, dc 19:889-892) and marks every entry whose
    poll read WaitingForInput (dc 19:899-901), and which then admits none of
    them (none fits the pages or slots free) and drops none."""
    return handshake(c, s), ()


def _latches_gated(c, s, r):
    """A ``pop_transferred`` call that hands nothing on but latches: entry r
    (the first such names the call) reads Success, which the metadata gate
    holds back, while another request of its room could still pop or fail
    the room's entry; no entry of the queue is ready and the poll raises
    nothing (a call with a ready entry is ``d_transferred``)."""
    def latchable(u):
        return (receiver_unlatched(c, s, u) and d_room_of(c, s, u).status == KVPoll.Success
                and room_shared_on_decode(c, s, u))
    if not latchable(r) or any(latchable(u) for u in range(r)):
        return False
    queued = [u for u, d in enumerate(s.d) if d.stage is DStage.TRANSFER]
    return (not transfer_poll_raises(c, s)
            and not any(transfer_poll(c, s, u) in (KVPoll.Success, KVPoll.Failed)
                        for u in queued))


@action("decode", guard=_latches_gated, needs=Needs(d={DStage.TRANSFER}))
def d_transfer_poll(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """D3 ``pop_transferred`` whose poll latches ``conclude_state`` on every
    entry reading Success (mc 19:2606-2611, 21:3031-3037) and whose metadata
    gate then holds each back as Transferring (the slot's room still 0,
    ut 21:173-189): nothing is handed on.  The latch is what the entry reads
    from then on, whatever happens to the room's entry.  Taken only where
    another receiver of the room is live (``kvmanager.room_shared_on_decode``);
    otherwise the latch changes nothing a later poll would not read."""
    return latch_transfer_queue(c, s), ()
