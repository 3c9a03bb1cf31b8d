"""Mutant releases: deliberately wrong guard points and cleanups, and the
fixes some findings ask for.

A mutant is a release record made with ``attrs.evolve``, the same shape a
guard proposal takes.  The suite uses them to show that properties which
hold on every real release can still fail (no vacuous property), that a
guard blocking everything fails the reachability checks, and that a
property every real release fails holds once the fix its finding names is
in the record (``session-abort-on-every-exit``, ``abort-verdict-kept``).
"""
from __future__ import annotations

from typing import Dict

import attrs

from reqmodel.model import guards as g
from reqmodel.model.releases import R0520, R0521, R0522, R0523, Release


def naive_prefill_door(req) -> bool:
    """Retire whenever a verdict is pending: the fix the write-up warns against."""
    return g.is_aborted(req)


def naive_decode_door(req, is_retracted: bool, is_rebootstrap: bool) -> bool:
    return g.is_aborted(req)


def drop_every_prealloc(req) -> bool:
    """Decode's prealloc scan drops every entry (it answers, and tells
    prefill nothing)."""
    return True


def deny_prefill_door(req) -> bool:
    return True


def deny_decode_door(req, is_retracted: bool, is_rebootstrap: bool) -> bool:
    return True


MUTANTS: Dict[str, Release] = {
    # retire anything with to_finish at the door, re-entries included
    "naive-door": attrs.evolve(R0521, name="naive-door", prefill_door=naive_prefill_door,
                               decode_door=naive_decode_door),
    # the #38935 doors, but the retire only streams: slot and handle are never released
    "door-without-cleanup": attrs.evolve(R0521, name="door-without-cleanup",
                                         retire_cleanup=("promote", "stream")),
    # a door that refuses service to everyone
    "deny-all": attrs.evolve(R0521, name="deny-all", prefill_door=deny_prefill_door,
                             decode_door=deny_decode_door),
    # mixed versions: a 0.5.22 prefill behind a 0.5.20-style decode, which
    # arms its tracker after the ABORT and holds only the ranks that notified
    # prefill (no force-arm on a prefill-reported failure): the ABORT carries
    # no generation, gets no target (mc 22:2838-2840) and so no ack; the holds
    # wait for the timeout (upstream warns of mixed versions on the ack side,
    # cc 22:870-873).  Without the second half, a failure prefill reports for
    # a write in flight reaches decode, whose 0.5.22 force-arm sends a
    # generation-tagged ABORT, and the ack path works again.
    "generation-less-aborts": attrs.evolve(R0522, name="generation-less-aborts",
                                           arm_before_send=False, hold_unnotified=False),
    # an optimistic release-and-requeue that spends no attempt: a request that
    # yields to a bootstrapped peer comes back to the front of the waiting
    # queue for ever (no-livelock's deliberately wrong record)
    "requeue-forever": attrs.evolve(R0521, name="requeue-forever", requeue_spends_attempt=False),
    # a prealloc scan that drops everything: decode answers, prefill is never
    # told and waits for its bootstrap timeout (answered-without-timeout's)
    "drop-every-prealloc": attrs.evolve(R0521, name="drop-every-prealloc",
                                        prealloc_scan=drop_every_prealloc),
    # a decode whose waiting timeout fails the room without sending prefill
    # its ABORT: a prefill request whose chunk sits with a dead transfer
    # worker then waits in the inflight queue with no timeout of its own
    # (prefill's only one is the bootstrap timeout): every-wait-bounded's
    # record; every real release notifies (cc 19:1612-1618 ... 23:2905-2911)
    "silent-waiting-timeout": attrs.evolve(R0520, name="silent-waiting-timeout",
                                           waiting_timeout_notifies=False),
    # 0.5.23 with 0.5.19's final-result handling, no abort check: the late
    # final result of a request retired at the door puts it (no KV any more)
    # in the inflight queue, whose Failed path calls release_kv_cache
    # unconditionally and trips its supports_mamba() assertion (memc
    # 19:257-260): the prefill scheduler dies (no-scheduler-crash's record;
    # every real release from 0.5.20 on retires the result first)
    "unchecked-final-result": attrs.evolve(R0523, name="unchecked-final-result",
                                           final_result=g.final_result_unchecked),
    # the fix session-turn-left-in-flight asks for, on 0.5.23: every exit that
    # ends a request without release_kv_cache also calls the streaming
    # session's abort_req, as the door's retire does (sch 23:3457-3461):
    # session-mark-released then holds (a proposal, not a wrong record)
    "session-abort-on-every-exit": attrs.evolve(R0523, name="session-abort-on-every-exit",
                                                exits_abort_session_turn=True),
    # the fix client-abort-answered-as-failure asks for, on 0.5.23: abort_request
    # gives a handoff queue's entry the abort's own verdict and the failure
    # paths keep it: answer-matches-cause then holds where a client's abort
    # meets a handoff queue (a proposal, not a wrong record)
    "abort-verdict-kept": attrs.evolve(R0523, name="abort-verdict-kept",
                                       handoff_abort_keeps_verdict=True),
}
