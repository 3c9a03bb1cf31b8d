"""A door that refuses everyone: no leak can happen, and no request is served.
The reachability properties must report it broken."""
from reqmodel.proposals import RETIRE_CLEANUP_FULL

base = "0.5.21"
retire_cleanup = RETIRE_CLEANUP_FULL


def prefill_door(req):
    return True


def decode_door(req, is_retracted, is_rebootstrap):
    return True
