"""#38704's idea on 0.5.23: decode refuses to commit a transfer that does not
cover the range it reserved (the aux would carry the length prefill sent)."""
from reqmodel.proposals import FINISH_ABORT

base = "0.5.23"


def commit_check(req, slot, expected_room):
    if slot.room == 0 or slot.room != expected_room:
        return FINISH_ABORT(500)
    if slot.covered_pages < req.reserved_pages:
        return FINISH_ABORT(500)
    return None
