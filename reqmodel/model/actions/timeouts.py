"""Timeouts, and decode's receipt of prefill's ABORT_ACK (the other way a
deferred hold ends).

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

from typing import Tuple

from reqmodel.model.events import AckDropped, RankRelease
from reqmodel.model.actions.core import (action, CHANNEL_ARG, Ctx, Effect, Event, HISTORY, Needs,
                                         pranks, RANK_ARG, set_d, set_p)
from reqmodel.model.actions.drelease import do_release, resolve_held
from reqmodel.model.actions.kvmanager import (all_ranks, d_room_of, latch_transfer_queue,
                                              note_ack, notify_abort, receiver_fail,
                                              receiver_poll, record_failure, room_of,
                                              transfer_poll_raises)
from reqmodel.model.actions.transport import (arriving, channel_args, consume, prank_of, rank_args,
                                              rank_of)
from reqmodel.model.state import DStage, KVPoll, MsgKind, PStage, State


def _bootstrapping_ranks(c, s, r):
    return [q for q in pranks(c) if room_of(c, s, r, q).status == KVPoll.Bootstrapping]


def _bootstrapping_sender(c, s, r):
    req = s.p[r]
    return (req.has_sender and req.stage is not PStage.GONE
            and bool(_bootstrapping_ranks(c, s, r)) and req.concluded is None)


@action("prefill", guard=_bootstrapping_sender, event="timeouts",
        timeout="SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
        armed="while one of prefill's senders for the request is still Bootstrapping "
              "(decode's destinations have not all arrived)")
def p_bootstrap_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s, env 19:656): a sender
    still Bootstrapping records a failure and goes Failed.  Every prefill
    rank's sender started its clock in the same scheduler step, so the ranks
    still bootstrapping time out together.  The timeout lives in the sender's
    ``poll()`` (``_check_bootstrap_timeout``, cc 19:1320-1337, 21:1675-1693,
    from mc 19:2410-2413, 21:2820-2838), which returns Failed to the scan
    that polled, and that scan handles the Failed in the same call
    (``handle_bootstrap_failure``): the request is aborted whatever the
    bootstrap thread writes into ``request_status`` meanwhile.  For a request
    in the bootstrap queue the model latches Failed on the sender
    (``concluded``), so ``pop_bootstrapped``'s next poll is that Failed;
    without it, 0.5.19's ``update_status`` (the larger of the two,
    cc 19:365-380, Failed being 0) let metadata arriving next turn the room
    back to WaitingForInput and the timed-out request go on.  (At the other
    stages the step still only records the failure: notes/design.md, "The
    bootstrap timeout".)"""
    for q in _bootstrapping_ranks(c, s, r):
        s = record_failure(c, s, r, q)
    if s.p[r].stage is PStage.BOOTSTRAP:
        s = set_p(s, r, concluded=KVPoll.Failed)
    return s, ()


def _d_waiting_too_long(c, s, r):
    req = s.d[r]
    return (req.stage is DStage.TRANSFER and receiver_poll(c, s, r) == KVPoll.WaitingForInput
            and not s.room_msgs("status", r) and not transfer_poll_raises(c, s))


def _waiting_timeout_ranks(c, s, r):
    return rank_args(c, all_ranks(c))


@action("decode", guard=_d_waiting_too_long,
        needs=Needs(d={DStage.TRANSFER}), choices=_waiting_timeout_ranks, event="timeouts",
        arg_names=RANK_ARG,
        timeout="SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
        armed="while decode's receiver, initialised, waits in the transfer queue with no "
              "status from prefill in flight")
def d_waiting_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``_check_waiting_timeout`` (cc 1595/1823/1982/2501/2888, 300 s) on one
    decode rank: record a failure, go Failed, send that rank's ABORT to P, set
    ``abort_notified``.  0.5.19/0.5.20 never arm the drain-ack tracker here
    (cc 19:1605-1619); 0.5.21+ arm it first (cc 21:2046-2049).  The
    receiver's ``poll()`` is what notices the timeout (mc 19:2606-2614,
    20:2760-2768, 21:3031-3039; cc 22:2295, 23:2609), and only
    ``pop_transferred`` polls a transfer-queue entry: a step of the decode
    loop's transfer phase (``processes.DECODE_LOOP``), so not while a request
    waits retracted or the engine is paused (the loop returns before that
    scan; the registry's gate, ``core._loop_gated``).  The poll is
    MIN-reduced over ranks, so the request fails on every rank.  The same
    poll latches every other entry that reads Success or Failed
    (``latch_transfer_queue``), and raises first on a popped room."""
    s = latch_transfer_queue(c, s, but=r)
    s = set_d(receiver_fail(c, s, r), r, receiver_state=KVPoll.Failed)
    if not c.release.waiting_timeout_notifies:  # a mutant's: no real release
        return s, ()
    return notify_abort(c, s, r, (rank_of(arg),), arm=c.release.arm_before_send), ()


def _ack_arrived(c, s, r):
    return bool(arriving(c, s, "ack", r))


def _ack_channels(c, s, r):
    return channel_args(c, sorted({(m.rank, m.prank) for m in arriving(c, s, "ack", r)}))


@action("decode", guard=_ack_arrived,
        needs=Needs(msgs={MsgKind.ack}), choices=_ack_channels, arg_names=CHANNEL_ARG)
def d_recv_ack(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """An ABORT_ACK answering request r's ABORT reaches one decode rank, behind
    every older report and ack of its prefill rank to that decode rank
    (``transport.P_TO_D``; ``note_abort_ack(room)``, cc 19:391-396; 0.5.22+
    ``handle_abort_ack_message``, cc 22:853-876): counted by the room's
    tracker on that rank if it is armed and, from 0.5.22, for the generation
    it armed; every held request of the room then re-checks
    (``resolve_deferred_releases`` -> ``_do_release``)."""
    k, q = rank_of(arg), prank_of(arg, 1)
    msg = next(m for m in arriving(c, s, "ack", r) if m.rank == k and m.prank == q)
    s, counted = note_ack(c, consume(s, msg), r, k, q, msg.gen)
    if not counted:
        return s, (AckDropped(r, "decode", k),)
    # every held entry is judged on the tracker as it is now, before any of
    # them is released (a release pops the room's tracker), dc 19:2413-2423
    tracker = d_room_of(c, s, r)
    evs: Tuple[Event, ...] = ()
    for u in c.scenario.room_sharers(r):
        s, ev = resolve_held(c, s, u, tracker)
        evs += ev
    return s, evs


def _hold_may_pass(c, s, r):
    """Held, and no write that was in flight when the hold was armed still
    runs (``model.clocks``: such a write ends within MC_TRANSFER_TIMEOUT, at
    most the deferral timeout, so before the hold's deadline passes)."""
    return s.d[r].stage is DStage.HELD and not s.d[r].outlasts


def _writes(s: State) -> Tuple[Tuple[int, int], ...]:
    return tuple(sorted({(m.rid, m.prank) for m in s.net if m.kind == "write"}))


def track_outlasts(s: State, nxt: State) -> State:
    """``nxt`` with each request's ``outlasts`` carried on from ``s``: armed
    with the writes in flight when the request goes HELD (they are in flight
    in ``nxt``: a step that arms the hold lands no write), kept while those
    writes are in flight, emptied when the hold ends."""
    writes = None
    for r, (was, now) in enumerate(zip(s.d, nxt.d)):
        if now.stage is DStage.HELD:
            if writes is None:
                writes = _writes(nxt)
            keep = (writes if was.stage is not DStage.HELD
                    else tuple(x for x in was.outlasts if x in writes))
        else:
            keep = ()
        if keep != now.outlasts:
            nxt = set_d(nxt, r, outlasts=keep)
    return nxt


def note_hold_outlasts(c: Ctx, s: State, nxt: State, evs) -> State:
    """History for the deferral timeout (``d_deferred_timeout``): which
    writes the hold outlasts, where ``MC_TRANSFER_TIMEOUT`` is at most the
    deferral timeout in the scenario's deployment (``clocks.hold_outlasts_writes``)."""
    if not c.deferred or not c.hold_outlasts_writes:
        return nxt
    return track_outlasts(s, nxt)


HISTORY.append(note_hold_outlasts)


def _deadline_ranks(c, s, r):
    """Whose deadline passes: up to 0.5.22 each holding rank's, on its own
    clock; from 0.5.23 every rank's at once (the release is MIN-reduced)."""
    if c.release.release_reduced:
        return ((),)
    return rank_args(c, s.d[r].held)


@action("decode", guard=_hold_may_pass, needs=Needs(d={DStage.HELD}), choices=_deadline_ranks,
        event="timeouts", arg_names=RANK_ARG,
        timeout="SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
        armed="while decode holds a failed request's pages for prefill's drain ack")
def d_deferred_timeout(c: Ctx, s: State, r: int, arg=()) -> Effect:
    """``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`` (30 s): a held
    device entry is released anyway ("releasing anyway", dc 19:2405-2436).
    Each rank armed its deadline in the iteration that agreed on the failure,
    each on its own clock, and up to 0.5.22 checks it alone
    (``now >= deadline``, dc 19:2413-2420, 21:2838-2843, 22:2976-2982): the
    deadlines can pass one iteration apart, and a rank whose deadline passed
    frees its copy while its peers hold.  0.5.23 MIN-reduces readiness over
    every held entry (dc 23:3053-3069): the ranks release together, at the
    last rank's deadline.  The deadline is armed with the hold (dc 21:2783,
    22:2891, 23:2998), so it does not pass while a write that was in flight
    then still runs, where ``MC_TRANSFER_TIMEOUT`` is at most this timeout
    (``_hold_may_pass``, ``model.clocks``)."""
    if arg and len(s.d[r].held) > 1:
        k = rank_of(arg)
        req = s.d[r]
        s = set_d(s, r, held=tuple(x for x in req.held if x != k),
                  released_on=tuple(sorted(req.released_on + (k,))), deadline_passed=True)
        return s, (RankRelease(r, "decode", (k,)),)
    return do_release(c, s, r, on_ack=False)
