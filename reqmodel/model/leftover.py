"""What a request leaves behind: the state predicates of the lifetime
properties that ask whether a request gone from the workers still owns
something (``release-exactly-once``, ``room-state-released``,
``session-mark-released``; the catalog entries are in ``properties``)."""
from __future__ import annotations

from reqmodel.model.state import DStage, PStage, State


def nothing_left_behind(s: State) -> bool:
    """A request that is gone, with no prefill result still due, owns nothing:
    no KV pages, metadata buffer or slot, and on decode no host backup of a
    memory retraction (``kv.retraction_backup``)."""
    for p, d in zip(s.p, s.d):
        if p.stage is PStage.GONE and not p.results_due and (p.holds_kv or p.holds_metadata):
            return False
        if d.stage is DStage.GONE and (d.pages or d.meta_slot >= 0 or d.retraction_backup):
            return False
    return True


def room_state_released(s: State) -> bool:
    """Once every user of a room is gone from both workers and nothing of
    the room is on the wire, no control-plane entry of the room remains."""
    for slot in sorted({s.room_slot(r) for r in range(len(s.p))}):
        users = [r for r in range(len(s.p)) if s.room_slot(r) == slot]
        if any(s.p[r].stage is not PStage.GONE or s.d[r].stage is not DStage.GONE for r in users):
            continue  # the room is (or will be) in use
        if any(s.room_slot(m.rid) == slot for m in s.net):
            continue  # the room is still in use on the wire
        left = any(room.status is not None or room.dst is not None or room.failure_record
                   or room.ack_to or room.poisoned or room.outstanding
                   for room in s.rooms_of_slot(slot))
        t = s.d_rooms[slot]
        if left or t.armed or t.status is not None or t.responded:
            return False
    return True


def session_turns_ended(s: State) -> bool:
    """No request is gone from a worker (prefill: no result still due) with
    its streaming session's in-flight mark still set there."""
    return not any((p.stage is PStage.GONE and not p.results_due and p.session_slot)
                   or (d.stage is DStage.GONE and d.session_slot) for p, d in zip(s.p, s.d))
