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
"""
from __future__ import annotations

from reqmodel.model.actions.core import action, Ctx, Effect, Needs
from reqmodel.model.actions.decode import (_can_prealloc, _handshake_polls, _scanned, handshake,
                                           handshake_raises, unmarked)
from reqmodel.model.state import DStage, State


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
