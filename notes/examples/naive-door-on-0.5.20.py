"""The naive door: retire anything that carries an abort verdict.

The write-up warns against exactly this: a re-entering request (retracted,
preempted, holding KV or a host backup) can carry a pending abort too, and
its queue owns the release of what it still holds."""
from reqmodel.proposals import RETIRE_CLEANUP_FULL, is_aborted

base = "0.5.20"
retire_cleanup = RETIRE_CLEANUP_FULL


def prefill_door(req):
    return is_aborted(req)


def decode_door(req, is_retracted, is_rebootstrap):
    return is_aborted(req)
