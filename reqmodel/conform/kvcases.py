"""Conformance cases at the KV managers' bookkeeping: ``status_merge`` and
``abort_ack``.

The KV managers keep their state per ``bootstrap_room`` apart from the
schedulers (``actions/kvmanager.py``): on prefill, one record per prefill
rank (``Room``: ``request_status``, ``failure_records``, ``transfer_infos``,
ABORT_ACK targets, poison mark, outstanding count); on decode, the status
entry, the response tracker and one drain-ack tracker per decode rank
(``DRoom``).  A case is one record *as the model reaches it* (every
reachable state of the built-in scenarios and the walks of ``cases.py``),
one operation of the real manager, and the record the model's own helper
(the function its actions call) predicts after it:

``status_merge``
    prefill: ``update_status(room, X)`` for every ``KVPoll``,
    ``conclude_transfer(room, Success | Failed)`` (the worker's end of a
    transfer, ``kvmanager.conclude``), ``sender.abort()``; decode:
    ``apply_prefill_status`` for each status report the model has in flight
    to the room (``kvmanager.apply_report``).
``abort_ack``
    prefill: each ABORT the model has in flight to that prefill rank, handled
    by ``_handle_abort_notification`` where the release has it (0.5.22+,
    ``kvmanager.handle_abort``) and otherwise registered as the release's
    bootstrap thread registers it (``register_deferred_ack_target`` +
    ``_maybe_ack_drained_abort``, ``kvmanager.register_ack_target``); the
    drained-abort ack alone (``_maybe_ack_drained_abort``), ``sender.clear()``
    and ``sender.failure_exception()``; decode, per decode rank:
    ``register_deferred_abort_room``, each ABORT_ACK the model has in flight
    to that rank (``note_abort_ack``, or ``handle_abort_ack_message`` where
    acks carry a generation), ``is_abort_release_safe`` and
    ``clear_deferred_abort_state``.

Decode ranks map to endpoints (``10.0.0.<k+1>``, port ``17000+k``) and
prefill ranks to ``_prefill_unique_rank()``, so targets, acks and their
generations are compared as ``[decode rank, prefill rank, generation]``.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

from reqmodel.model.actions import kvmanager as kvm
from reqmodel.model.actions.core import Ctx, pranks
from reqmodel.model.state import DRoom, KVPoll, Msg, MsgKind, replace, Room, State

Prediction = Tuple[str, str, dict, dict]  # (seam, helper, inputs, expect)


def poll_name(poll: Optional[KVPoll]) -> Optional[str]:
    return None if poll is None else poll.name


def _room_in(room: Room) -> dict:
    """A prefill record as the worker seeds it.  ``ack_to`` keeps its order:
    on 0.5.21 the first entry is the registered target and the rest the
    ``transfer_infos`` snapshot taken with it."""
    return {"status": poll_name(room.status), "failure_record": room.failure_record,
            "peers": None if room.dst is None else list(room.peers),
            "ack_to": [[k, g] for k, g, _ in room.ack_to], "poisoned": room.poisoned,
            "outstanding": room.outstanding}


def _room_out(c: Ctx, room: Room, s: State, reports: bool = False) -> dict:
    """What the real manager shows after the operation: the record, and the
    acks it sent (on a state whose network was empty); for a conclusion
    also the status reports, where ``conclude_transfer`` makes them (0.5.19's
    worker sends them inline, a path this seam does not drive)."""
    out = {"status": poll_name(room.status), "failure_record": room.failure_record,
            "transfer_infos": room.dst is not None,
            "ack_to": sorted({(k, g) for k, g, _ in room.ack_to}),
            "poisoned": room.poisoned, "outstanding": room.outstanding,
            "acks": sorted((m.rank, m.prank, m.gen) for m in s.net if m.kind == "ack"),
            "reports": sorted({poll_name(m.poll) for m in s.net if m.kind == "status"})}
    if not (reports and c.release.conclude_transfer):
        del out["reports"]
    return out


def tracker_of(t: DRoom, k: int) -> Optional[dict]:
    """Decode rank k's drain-ack tracker of the room: its generation and the
    prefill ranks that acked, or None when not armed."""
    armed = {rank: gen for rank, gen, _ in t.armed}
    return None if k not in armed else {"gen": armed[k], "acks": list(t.acked_by(k))}


def _d_room_in(t: DRoom, k: int) -> dict:
    """Decode rank k's record of the room, as the worker seeds it and as it
    reads it back."""
    return {"status": poll_name(t.status), "responded": sorted({q for q, _ in t.responded}),
            "tracker": tracker_of(t, k)}


def _emptied(s: State) -> State:
    return replace(s, net=())


def prefill_predictions(c: Ctx, s: State, r: int, q: int) -> Iterable[Prediction]:
    """The prefill record of request r's room on prefill rank q, every
    operation, and the model's prediction."""
    base = _emptied(s)
    room = kvm.room_of(c, base, r, q)
    common = {"room": _room_in(room), "q": q, "deferred": c.deferred}

    def out(nxt: State, reports: bool = False) -> dict:
        return _room_out(c, kvm.room_of(c, nxt, r, q), nxt, reports)

    for new in KVPoll:
        yield ("status_merge", "update_status", dict(common, op="update", status=new.name),
               out(kvm.update_status(c, base, r, new, q)))
    # a failure is concluded only for a room with decode's destinations (the
    # worker fails a chunk it takes, or a write in flight: xfer_fail's guard)
    for end in (KVPoll.Success,) + ((KVPoll.Failed,) if room.dst is not None else ()):
        yield ("status_merge", "conclude", dict(common, op="conclude", status=end.name),
               out(kvm.conclude(c, base, r, q, end), reports=True))
    yield ("status_merge", "record_failure", dict(common, op="abort"),
           out(kvm.record_failure(c, base, r, q)))
    yield ("abort_ack", "maybe_ack_drained", dict(common, op="drain"),
           out(kvm.maybe_ack_drained(c, base, r, q)))
    yield ("abort_ack", "clear_rank", dict(common, op="clear"),
           out(kvm.clear_rank(c, base, r, q)))
    yield ("abort_ack", "failure_exception_rank", dict(common, op="failure_exception"),
           out(kvm.failure_exception_rank(c, base, r, q)))
    k_slot = s.room_slot(r)
    aborts = sorted({(m.rank, m.gen) for m in s.net if m.kind == "abort" and m.prank == q
                     and s.room_slot(m.rid) == k_slot})
    for rank, gen in aborts:
        msg = Msg(MsgKind.abort, r, rank=rank, gen=gen, prank=q)
        if c.deferred:
            yield ("abort_ack", "handle_abort",
                   dict(common, op="abort_notification", rank=rank, gen=gen),
                   out(kvm.handle_abort(c, base, msg)))
        yield ("abort_ack", "register_ack_target", dict(common, op="register", rank=rank, gen=gen),
               out(kvm.maybe_ack_drained(c, kvm.register_ack_target(c, base, msg), r, q)))


def decode_predictions(c: Ctx, s: State, r: int, k: int) -> Iterable[Prediction]:
    """Decode rank k's record of request r's room, every operation, and the
    model's prediction."""
    t = kvm.d_room_of(c, s, r)
    common = {"room": _d_room_in(t, k), "k": k, "pranks": c.scenario.prefill.ranks,
              "next_gen": kvm.fresh_generation(c, s, r) if c.release.ack_generations else 0}

    def out(nxt: State) -> dict:
        return _d_room_in(kvm.d_room_of(c, nxt, r), k)

    slot = s.room_slot(r)
    mine = [m for m in s.net if s.room_slot(m.rid) == slot]
    for q, poll in sorted({(m.prank, m.poll) for m in mine if m.kind == "status"}):
        yield ("status_merge", "apply_report",
               dict(common, op="report", prank=q, status=poll.name),
               out(kvm.apply_report(c, s, r, q, poll, r)))
    yield ("abort_ack", "arm_tracker", dict(common, op="arm"),
           dict(out(kvm.arm_tracker(c, s, r, k, common["next_gen"])), gen=common["next_gen"]))
    for q, gen in sorted({(m.prank, m.gen) for m in mine if m.kind == "ack" and m.rank == k}):
        yield ("abort_ack", "note_ack", dict(common, op="ack", prank=q, gen=gen),
               out(kvm.note_ack(c, s, r, k, q, gen)[0]))
    yield ("abort_ack", "release_safe", dict(common, op="safe"),
           dict(out(s), safe=kvm.release_safe(c, t, k)))
    yield ("abort_ack", "clear_tracker", dict(common, op="clear_tracker"),
           out(kvm.set_d_room(c, s, r, armed=(), acked=())))


def rooms(c: Ctx, s: State) -> Iterable[int]:
    """One request per room of ``s`` (requests sharing a ``bootstrap_room``
    share its records).  Rooms a request has not opened yet are included: a
    fresh record is a record the code meets too."""
    seen = set()
    for r in range(c.scenario.n):
        if s.room_slot(r) not in seen:
            seen.add(s.room_slot(r))
            yield r


def predictions(c: Ctx, s: State, r: int) -> Iterable[Prediction]:
    """Every KV-manager case of request r's room in ``s``: its record on each
    prefill rank and each decode rank, and every operation."""
    for q in pranks(c):
        yield from prefill_predictions(c, s, r, q)
    for k in range(c.scenario.decode.ranks):
        yield from decode_predictions(c, s, r, k)


def room_key(c: Ctx, s: State, r: int) -> Tuple:
    """What the predictions of request r's room depend on, so that a room
    record seen before (under the same configuration) is skipped: most
    states differ elsewhere."""
    slot = s.room_slot(r)
    msgs = tuple(sorted((m.kind, m.rank, m.prank, m.gen, poll_name(m.poll)) for m in s.net
                        if m.kind in ("abort", "ack", "status") and s.room_slot(m.rid) == slot))
    sc = c.scenario
    return (sc.prefill.ranks, sc.decode.ranks, c.deferred,
            tuple(kvm.room_of(c, s, r, q) for q in pranks(c)), kvm.d_room_of(c, s, r), msgs)

