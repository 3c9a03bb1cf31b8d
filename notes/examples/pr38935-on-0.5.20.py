"""#38935 on 0.5.20: retire intake rejects that own nothing at both doors."""
from reqmodel.proposals import RETIRE_CLEANUP_FULL, is_unadmitted_reject

base = "0.5.20"
retire_cleanup = RETIRE_CLEANUP_FULL  # what Scheduler.retire_unadmitted_request runs


def prefill_door(req):
    return is_unadmitted_reject(req)


def decode_door(req, is_retracted, is_rebootstrap):
    return not is_retracted and not is_rebootstrap and is_unadmitted_reject(req)
