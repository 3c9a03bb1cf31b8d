"""Guard-point implementations, one named function per SGLang variant.

A *guard point* is a decision SGLang takes at one place in the pipeline and
that changed between releases.  Each release record (``reqmodel.releases``)
names the implementation it uses at every guard point; a proposal (issue #6)
replaces some of them.  The functions receive the model's request values,
whose field names are SGLang's (``to_finish``, ``finished_reason``,
``is_retracted``, ``holds_kv``, ``holds_mamba``, ``metadata_buffer_index``,
``retraction_backup``, ``pending_bootstrap``), and must not mutate them
(they are frozen).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import attrs

from reqmodel.model.state import ABORT_500, LENGTH, Finish

# ---------------------------------------------------------------- predicates


def is_aborted(req) -> bool:
    """ut ``is_aborted`` (ut 1363/1707/1783/1883/1970): either field is FINISH_ABORT."""
    return bool((req.to_finish is not None and req.to_finish.is_abort)
                or (req.finished_reason is not None and req.finished_reason.is_abort))


def finished(req) -> bool:
    """``Req.finished`` (sb 1359/1480/1551/1589/1657): reads ``finished_reason`` only."""
    return req.finished_reason is not None


def is_unadmitted_reject(req) -> bool:
    """ut 21:1754 / 22:1854 / 23:1941: aborted and owning nothing, not re-entering."""
    return is_aborted(req) and not (
        req.is_retracted or req.holds_kv or req.holds_mamba
        or req.metadata_buffer_index >= 0 or bool(req.retraction_backup))


# ------------------------------------------------------- prefill door (P1)


def prefill_door_admit_all(req) -> bool:
    """0.5.19/0.5.20 ``PrefillBootstrapQueue.add`` (pf 19:385, 20:399): no door.

    ``create_sender`` follows; its capacity check reads ``len(origin_input_ids)``,
    which the 1-token stub always passes.
    """
    return False


def prefill_door_unadmitted_reject(req) -> bool:
    """0.5.21+ (#38935): ``if is_unadmitted_reject(req): retire`` (pf 21:422-424,
    22:434-436, 23:457-459)."""
    return is_unadmitted_reject(req)


# -------------------------------------------------------- decode door (D1)


def decode_door_admit_all(req, is_retracted: bool, is_rebootstrap: bool) -> bool:
    """0.5.19/0.5.20 ``DecodePreallocQueue.add`` (dc 19:617, 20:640): no door."""
    return False


def decode_door_unadmitted_reject(req, is_retracted: bool, is_rebootstrap: bool) -> bool:
    """0.5.21+ (dc 21:750-752, 22:800-802, 23:824-826): the caller's flags first,
    because a decode-side Req carries none of the resource markers."""
    return not is_retracted and not is_rebootstrap and is_unadmitted_reject(req)


# ------------------------------------------- prefill result processing (P5)


def final_result_unchecked(req) -> bool:
    """0.5.19 final-chunk branch (pf 19:752-797): no abort check; the result is
    cached, queued in the inflight queue and its last chunk sent."""
    return False


def final_result_retire_aborted(req) -> bool:
    """0.5.20+ (#36988, pf 20:781-786, 21:839, 22:937, 23:980): ``is_aborted`` ->
    ``_retire_aborted_prefill_result`` and nothing is sent."""
    return is_aborted(req)


REQUEUE, RETIRE, DROP, SEND = "requeue", "retire", "drop", "send"


def middle_result_requeue_first(req, still_chunking: bool) -> str:
    """0.5.19 middle-chunk branch: ``pending_bootstrap and not still_chunking`` ->
    ``optimistic_release_and_requeue`` (pf 19:823) runs before the ``is_aborted``
    drop (pf 19:831)."""
    if req.pending_bootstrap and not still_chunking:
        return REQUEUE
    if is_aborted(req):
        return DROP
    return SEND


def middle_result_abort_first(req, still_chunking: bool) -> str:
    """0.5.20+ (pf 20:886-899): the abort is checked first; retire when no chunk
    of the request is still in flight, never requeue."""
    if is_aborted(req):
        return DROP if still_chunking else RETIRE
    if req.pending_bootstrap and not still_chunking:
        return REQUEUE
    return SEND


# --------------------------------------------- inflight queue Success (P6)


def inflight_success_length_unless_abort(req) -> Finish:
    """All releases (pf 19:925-927, 20:1002, 21:1060, 22:1183, 23:1226):
    ``FINISH_LENGTH(0)`` unless ``finished_reason`` is already FINISH_ABORT;
    ``to_finish`` is ignored (#33508 is in no release)."""
    if req.finished_reason is not None and req.finished_reason.is_abort:
        return req.finished_reason
    return LENGTH


# ------------------------------------------------ decode prealloc scan (D2)


def prealloc_scan_finished_reason(req) -> bool:
    """All releases (dc 19:1141, 20:1157, 21:1293, 22:1365, 23:1395): drop entries
    whose ``finished_reason`` is FINISH_ABORT; ``to_finish`` is not read."""
    return req.finished_reason is not None and req.finished_reason.is_abort


# ---------------------------------------------------- decode commit (D3)


def commit_room_check(req, slot, expected_room: int) -> Optional[Finish]:
    """All releases ``_commit_transfer_to_req`` (dc 19:2059, 20:2131, 21:2404,
    22:2507, 23:2600): room 0 -> 500 "not ready", another room -> 500
    "corruption".  No length check (#38704 is in no release)."""
    if slot.room == 0 or slot.room != expected_room:
        return ABORT_500
    return None


# ----------------------------------------------- update_status merge (§5.1)


def update_status_019(current, new):
    """cc 19:365-380: create unless the new state is Failed; Failed sets; else max."""
    from reqmodel.model.state import KVPoll
    if current is None:
        return None if new == KVPoll.Failed else new
    if new == KVPoll.Failed:
        return KVPoll.Failed
    return max(current, new)


def update_status_020(current, new):
    """cc 20:395-412 (… 23:653-680): create only for Bootstrapping/WaitingForInput;
    Failed sets and is terminal; otherwise max."""
    from reqmodel.model.state import KVPoll
    if current is None:
        return new if new in (KVPoll.Bootstrapping, KVPoll.WaitingForInput) else None
    if new == KVPoll.Failed:
        return KVPoll.Failed
    if current == KVPoll.Failed:
        return KVPoll.Failed
    return max(current, new)


@attrs.frozen
class GuardPoint:
    """A replaceable decision: its arguments, what it returns, and a check of
    the returned value (used on proposals)."""

    name: str
    args: Tuple[str, ...]
    returns: str
    meaning: str
    valid: Callable[[object], bool]


def _is_bool(v) -> bool:
    return isinstance(v, bool)


def _is_finish(v) -> bool:
    return isinstance(v, Finish)


GUARD_POINTS: Dict[str, GuardPoint] = {gp.name: gp for gp in (
    GuardPoint("prefill_door", ("req",), "bool",
               "True: retire the request at PrefillBootstrapQueue.add (P1)", _is_bool),
    GuardPoint("decode_door", ("req", "is_retracted", "is_rebootstrap"), "bool",
               "True: retire the request at DecodePreallocQueue.add (D1)", _is_bool),
    GuardPoint("final_result", ("req",), "bool",
               "True: retire an aborted final prefill result and send nothing (P5)", _is_bool),
    GuardPoint("middle_result", ("req", "still_chunking"),
               "'requeue' | 'retire' | 'drop' | 'send'",
               "what to do with a middle-chunk prefill result (P5)",
               lambda v: v in (REQUEUE, RETIRE, DROP, SEND)),
    GuardPoint("inflight_success", ("req",), "Finish",
               "the finished_reason set when the inflight poll says Success (P6)", _is_finish),
    GuardPoint("prealloc_scan", ("req",), "bool",
               "True: drop the entry at pop_preallocated before allocating (D2)", _is_bool),
    GuardPoint("commit_check", ("req", "slot", "expected_room"), "Finish | None",
               "None to commit the transfer, or the FINISH_ABORT to refuse it with (D3)",
               lambda v: v is None or _is_finish(v)),
)}


# The data a proposal may set besides guard points that changes what the
# model does (proposals.proposal.FIELDS describes them); 'reqmodel guard
# diff' compares them by value.
FIELD_POINTS = ("retire_cleanup", "checksum", "scenario_overrides")


# The fields a guard point may read, by view.  SGLang names where SGLang has
# the field; ``tests/test_guard.py`` checks every name exists on the view.
VIEWS: Dict[str, Dict[str, str]] = {
    "prefill req": {
        "to_finish": "pending verdict: Finish or None (set_finish_with_abort, abort method 3)",
        "finished_reason": "Finish or None; finished() reads only this",
        "origin_pages": "len(origin_input_ids) in pages (1 for the intake stub)",
        "is_retracted": "set by reset_for_retract (preemption, optimistic requeue)",
        "holds_kv": "kv.holds_kv: a KV row is held",
        "holds_mamba": "kv.holds_mamba",
        "metadata_buffer_index": "-1 or a metadata buffer slot",
        "retraction_backup": "always None on prefill",
        "pending_bootstrap": "sender not yet init-ed (optimistic prefill)",
        "inflight_middle_chunks": "overlapped middle results still due",
        "has_sender": "disagg_kv_sender is not None",
        "session_slot": "owns an active conversation slot",
        "cache_handle": "cache_request_handle is open",
    },
    "decode req": {
        "to_finish": "pending verdict: Finish or None",
        "finished_reason": "Finish or None",
        "origin_pages": "len(origin_input_ids) in pages",
        "is_retracted": "set by reset_for_retract, cleared at commit or resume",
        "holds_kv": "pages of the handoff range are reserved",
        "holds_mamba": "always False on decode",
        "metadata_buffer_index": "always -1 on decode (it lives on DecodeRequest)",
        "retraction_backup": "a host KV backup is held (memory retract)",
        "rebootstrap": "pd_rebootstrap_in_progress",
        "reserved_pages": "pages decode attends over: decode prefix + reserved pages",
        "prefix_pages": "decode_prefix_len (radix hit), in pages",
        "session_slot": "owns an active conversation slot",
        "cache_handle": "cache_request_handle is open",
    },
    "slot": {
        "room": "bootstrap_room written by the aux write (0: not ready)",
        "covered_pages": "pages of decode's range the transfer covered (#38704's length; "
                         "no release carries it)",
        "checksum": "prefill's KV digest, or None",
    },
}

VIEW_OF_ARG = {
    ("prefill_door", "req"): "prefill req", ("final_result", "req"): "prefill req",
    ("middle_result", "req"): "prefill req", ("inflight_success", "req"): "prefill req",
    ("decode_door", "req"): "decode req", ("prealloc_scan", "req"): "decode req",
    ("commit_check", "req"): "decode req", ("commit_check", "slot"): "slot",
}
