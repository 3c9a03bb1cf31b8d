"""Releases as data: which implementation each guard point and cleanup uses.

No action branches on a version string.  An action asks its release record
for the guard point or cleanup to run; a proposal (issue #6) or a mutant
(``reqmodel.mutants``) is just another record made with ``attrs.evolve``.

Line citations are ``file release:line`` with the abbreviations of the
modelling reference (pf = disaggregation/prefill.py, dc = decode.py,
ut = utils.py, cc = common/conn.py, sch = managers/scheduler.py,
sb = managers/schedule_batch.py, env = environ.py).  They were checked against
the wheels; see notes/traceability.md.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import attrs

from reqmodel import messages
from reqmodel.model import guards as g
from reqmodel.model.behaviours import INTAKE, POOL, PROMPT, SUFFIX, KVChecksum, SenderCapacity
from reqmodel.model.ackpolicy import FAN_OUT, LAST, PER_ENDPOINT, AckPolicy


class ReleaseError(ValueError):
    """Unknown release name; the message is one line for the user."""


# The steps ``Scheduler.retire_unadmitted_request`` runs, in order (sch 21:3242).
RETIRE_CLEANUP_FULL = ("session", "beam", "hicache", "promote", "stream")


@attrs.frozen
class Release:
    name: str
    # guard points -------------------------------------------------------
    prefill_door: Callable
    decode_door: Callable
    final_result: Callable
    middle_result: Callable
    inflight_success: Callable
    prealloc_scan: Callable
    commit_check: Callable
    # data-plane and cleanup choices ---------------------------------------
    update_status: Callable
    conclude_transfer: bool  # Success -> Failed when a failure is recorded (cc 20:507)
    retire_cleanup: Tuple[str, ...]  # steps of retire_unadmitted_request; () = no door retire
    p_waiting_abort_releases_all: bool  # method 1 on P frees KV and always aborts the sender
    requeue_fallback_frees_metadata: bool  # optimistic fallback frees the metadata buffer
    sender_capacity: SenderCapacity  # create_sender compares the prompt with the POOL or INTAKE limit
    deferred_release_default: bool  # decode KV deferral when the scenario says "default"
    # SGLANG_ENABLE_FAILED_SESSION_PROBE's default: prefill's Mooncake KV
    # manager runs a thread that takes a decode session off its failed list
    # once a probe answers (off up to 0.5.22, on in 0.5.23)
    failed_session_probe_default: bool
    checksum: Optional[KVChecksum]  # None | PROMPT (0.5.21/22) | SUFFIX (0.5.23, layout skip)
    client_abort_status: int  # method 3: FINISH_ABORT() status
    # ABORT/ABORT_ACK with deferral on (§5.4, §5.5) ----------------------------
    ack_targets: AckPolicy  # P: LAST target per room | FAN_OUT to peers too | PER_ENDPOINT
    ack_generations: bool  # ABORT/ack carry a generation; D counts only its own
    poison_failed_rooms: bool  # a failed batch or a worker's raise poisons the room: no ack ever
    arm_before_send: bool  # D arms its tracker in ensure_abort_notified, before ABORT
    hold_unnotified: bool  # D3 holds every deferrable failure (force_arm)
    release_reduced: bool  # D releases a hold on every rank together (MIN-reduced)
    new_room_drops_acks: bool  # update_status creating a room drops its targets and poison
    clear_drops_ack_target: bool  # sender clear() drops the target instead of acking a drained room
    clear_slot_resets_checksum: bool  # a freed metadata slot's checksum row is zeroed (clear_slot)
    has_cache_handle: bool  # Req.cache_request_handle exists
    # a streaming session's request is a PD request: Session.create_req passes
    # the bootstrap fields (SC 20:319-322, 23:322-327); 0.5.19 builds the Req
    # without them (SC 19:292), so the model's session turns do not apply
    pd_session_requests: bool
    # ``_release_aborted_request`` ends the streaming session's turn
    # (``session.abort_req()``, sch 22:3423, 23:3550): a client's abort in
    # prefill's bootstrap or waiting queue clears the in-flight mark at once
    release_aborted_clears_session: bool
    # the exits that end a request without release_kv_cache (decode's prealloc
    # drop, handle_bootstrap_failure, the doors' capacity rejections) call the
    # session's abort_req: no release does (a proposal's field)
    exits_abort_session_turn: bool
    # abort_request sets the abort's own verdict on an entry of a handoff
    # queue (prefill's bootstrap and inflight queues, decode's prealloc and
    # transfer queues), as its --pp-size > 1 branch does, and the failure
    # paths keep an abort verdict: no release does (a proposal's field)
    handoff_abort_keeps_verdict: bool
    # Decode host receive (host-staged destinations): None when the release
    # has no such mode; otherwise the classes of the built-in transfer
    # backends that accept host destinations, as ``path:Class`` under
    # ``disaggregation/`` (what conformance's source scan reports).  () on
    # every modelled release: the mode exists from 0.5.21 but decode refuses
    # to start with any shipped backend (notes/traceability.md "Host-staged
    # destinations").
    host_destination_backends: Optional[Tuple[str, ...]]
    # a prefill sender's poll on a room whose request_status entry is gone:
    # False = check_status raises KeyError (Mooncake's sender, mc 19:2401,
    # 20:2555, 21:2822, 22:3205); True = the poll reads Failed (0.5.23's
    # CommonKVSender, cc 23:2353-2356)
    sender_poll_missing_room_fails: bool
    # an optimistic release-and-requeue spends one of the request's
    # optimistic_prefill_attempts (pf 19:1375); only a mutant says False
    requeue_spends_attempt: bool
    # decode's handshake (``_update_handshake_waiters``) polls every prealloc
    # entry each iteration (True), or skips the poll while every entry is
    # waiting_for_input and none concluded Failed (0.5.19, dc 19:871-879)
    handshake_polls_waiting: bool
    # SGLANG_REQ_WAITING_TIMEOUT reaches the PD event loops: ``_poll_timeout_aborts``
    # turns an expired wait in the waiting queue into an AbortReq for this
    # worker's own abort_request (0.5.20+); 0.5.19's ``_abort_on_waiting_timeout``
    # runs only in get_next_batch_to_run, which neither PD loop calls
    req_waiting_timeout: bool
    # decode's waiting timeout sends the room's ABORT to prefill
    # (``_check_waiting_timeout`` -> ``_send_abort_notification``, cc 19:1612-1618,
    # 20:1840-1846, 21:1999-2005, 22:2518-2524, 23:2905-2911): without it a
    # prefill whose transfer stalled is never told, and has no timeout of its own
    waiting_timeout_notifies: bool
    # the timeouts' defaults in seconds, by the environment variable that
    # sets them (each timeout action names its variable)
    timeouts: Tuple[Tuple[str, float], ...]
    cites: Dict[str, str] = attrs.field(factory=dict, eq=False, hash=False)

    def timeout_seconds(self, env: str) -> float:
        """The default of the timeout that environment variable ``env`` sets."""
        return dict(self.timeouts)[env]

    def guard_points(self) -> Dict[str, Callable]:
        return {name: getattr(self, name) for name in g.GUARD_POINTS}


_COMMON = dict(
    inflight_success=g.inflight_success_length_unless_abort,
    prealloc_scan=g.prealloc_scan_finished_reason,
    commit_check=g.commit_room_check,
)

R0519 = Release(
    name="0.5.19",
    prefill_door=g.prefill_door_admit_all,
    decode_door=g.decode_door_admit_all,
    final_result=g.final_result_unchecked,
    middle_result=g.middle_result_requeue_first,
    update_status=g.update_status_019,
    conclude_transfer=False,
    retire_cleanup=(),
    p_waiting_abort_releases_all=False,
    requeue_fallback_frees_metadata=False,
    sender_capacity=POOL,
    deferred_release_default=False,
    failed_session_probe_default=False,
    checksum=None,
    client_abort_status=500,
    has_cache_handle=False,
    pd_session_requests=False,
    release_aborted_clears_session=False,
    exits_abort_session_turn=False,
    handoff_abort_keeps_verdict=False,
    host_destination_backends=None,
    sender_poll_missing_room_fails=False,
    requeue_spends_attempt=True,
    handshake_polls_waiting=False,
    req_waiting_timeout=False,
    waiting_timeout_notifies=True,
    timeouts=(("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300),  # env 19:656
              ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300),  # env 19:660
              ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0)),  # env 19:673
    ack_targets=LAST,
    ack_generations=False,
    poison_failed_rooms=False,
    arm_before_send=False,
    hold_unnotified=False,
    release_reduced=False,
    new_room_drops_acks=False,
    clear_drops_ack_target=True,
    clear_slot_resets_checksum=False,
    cites={
        "prefill_door": "pf 19:385-388 (add -> create_sender, no door)",
        "decode_door": "dc 19:617 (add, no door)",
        "final_result": "pf 19:752-797 (no abort check)",
        "middle_result": "pf 19:823 requeue before pf 19:831 is_aborted",
        "inflight_success": "pf 19:925-927",
        "prealloc_scan": "dc 19:1141",
        "commit_check": "dc 19:2059-2110",
        "update_status": "cc 19:365-380",
        "deferred_release": "env 19:672 (default False)",
        "failed_sessions": "env 19:750 probe off; mc 19:1869-1874 a failed batch lists the "
                           "session, 19:1722-1736 a listed session fails the chunk, "
                           "19:2276-2302 the probe pass (thread 19:273-285), 19:2105-2110 "
                           "re-registration",
        "ack_targets": "mc 19:2022-2088; cc 19:432-447 one target per room, overwritten",
        "arming": "sch 19:5067-5085 (transfer-queue abort arms after send, re-wipes); "
                  "_check_waiting_timeout cc 19:1595-1619 never arms",
        "hold": "dc 19:2305-2318 (env and abort_notified)",
        "clear": "cc 19:1339-1348 pops the ack target",
        "release": "dc 19:2405-2436 per rank: acks or 30 s",
        "sender_poll": "mc 19:2401 check_status KeyError on a popped room",
        "handshake": "dc 19:862-926 (skips the poll while all wait; ValueError on Success)",
        "req_waiting_timeout": "sch 19:3115-3144 only from get_next_batch_to_run (sch 19:3342); "
                               "the PD loops pf 19:633-675, dc 19:2560 never call it",
        "timeouts": "env 19:656, 19:660, 19:673",
        "session": "SC 19:292 builds the session's Req without bootstrap fields; "
                   "SS 19:298/319 from release_kv_cache only (memc 19:257 returns first "
                   "without KV)",
    },
    **_COMMON,
)

R0520 = attrs.evolve(
    R0519,
    name="0.5.20",
    final_result=g.final_result_retire_aborted,
    middle_result=g.middle_result_abort_first,
    update_status=g.update_status_020,
    conclude_transfer=True,
    client_abort_status=503,
    has_cache_handle=True,
    pd_session_requests=True,
    handshake_polls_waiting=True,
    req_waiting_timeout=True,
    cites={
        "prefill_door": "pf 20:399 (add -> create_sender, no door)",
        "decode_door": "dc 20:640 (add, no door)",
        "final_result": "pf 20:781-786 -> _retire_aborted_prefill_result pf 20:1096-1124",
        "middle_result": "pf 20:886-899 (abort first)",
        "inflight_success": "pf 20:1002",
        "prealloc_scan": "dc 20:1157",
        "commit_check": "dc 20:2131",
        "update_status": "cc 20:395-412, conclude_transfer cc 20:507",
        "deferred_release": "env 20:706 (default False)",
        "failed_sessions": "env 20:790 probe off; mc 20:2054-2059, 20:1911-1925, "
                           "20:2431-2457 (as 0.5.19)",
        "ack_targets": "mc 20:2195; cc 20:669-686 (as 0.5.19)",
        "arming": "sch 20:5318-5337 (as 0.5.19)",
        "hold": "dc 20 (as 0.5.19)",
        "release": "dc 20:2492 (as 0.5.19)",
        "sender_poll": "mc 20:2555 (as 0.5.19)",
        "handshake": "dc 20:887-942 (polls every entry; ValueError on Success)",
        "req_waiting_timeout": "sch 20:3304 _poll_timeout_aborts, called from recv sch 20:2078",
        "timeouts": "env 20:689, 20:693, 20:707 (as 0.5.19)",
        "session": "SC 20:319-322 passes the bootstrap fields; SS 20:304/325 from "
                   "release_kv_cache only (memc 20:279 returns first without KV)",
    },
)

R0521 = attrs.evolve(
    R0520,
    name="0.5.21",
    prefill_door=g.prefill_door_unadmitted_reject,
    decode_door=g.decode_door_unadmitted_reject,
    retire_cleanup=RETIRE_CLEANUP_FULL,
    p_waiting_abort_releases_all=True,
    deferred_release_default=True,
    checksum=PROMPT,
    ack_targets=FAN_OUT,
    clear_drops_ack_target=False,
    arm_before_send=True,
    hold_unnotified=True,
    host_destination_backends=(),
    cites={
        "prefill_door": "pf 21:422-424; ut 21:1754 is_unadmitted_reject",
        "decode_door": "dc 21:750-752",
        "retire_cleanup": "sch 21:3242 retire_unadmitted_request",
        "session": "sch 21:3248 the door's retire -> abort_req; otherwise SS 21:303/324 "
                   "from release_kv_cache -> claim_kv_row only (memc 21:308)",
        "final_result": "pf 21:839",
        "middle_result": "pf 21 (as 0.5.20)",
        "inflight_success": "pf 21:1060",
        "prealloc_scan": "dc 21:1293",
        "commit_check": "dc 21:2404",
        "update_status": "cc 21 (as 0.5.20)",
        "p_waiting_abort": "pf 21:586 release_aborted_prefill_waiting_req",
        "deferred_release": "env 21:722 (default True), mc 21:221 capable",
        "failed_sessions": "env 21:809 probe off; mc 21:2304-2309, 21:2158-2172, "
                           "21:2698-2724 (as 0.5.19)",
        "checksum": "pf 21:1333-1338, dc 21:3049-3054",
        "ack_targets": "mc 21:2449-2522 (register if active or outstanding); cc 21:689-739 "
                       "fan-out to transfer_infos peers, snapshot and target",
        "arming": "cc 21:2025-2050 ensure_abort_notified arms before ABORT",
        "hold": "dc 21:2692 ensure_abort_notified(force_arm=True)",
        "clear": "cc 21:1694-1709 acks a drained room, keeps an outstanding one's target",
        "release": "dc 21:2806-2858 per rank for device destinations",
        "host_receive": "dc 21:698-704; bc 21:124, 21:229 (False, no backend overrides it)",
        "sender_poll": "mc 21:2822 (as 0.5.19)",
        "handshake": "dc 21:1022-1077 (as 0.5.20)",
        "req_waiting_timeout": "sch 21:3379-3401, called from recv sch 21:2075",
        "timeouts": "env 21:704, 21:708, 21:723 (as 0.5.19)",
    },
)

R0522 = attrs.evolve(
    R0521,
    name="0.5.22",
    # found by conformance: the fallback into the bootstrap queue already
    # frees the metadata buffer here (pf 22:1720-1723), not only from 0.5.23
    requeue_fallback_frees_metadata=True,
    ack_targets=PER_ENDPOINT,
    ack_generations=True,
    poison_failed_rooms=True,
    new_room_drops_acks=True,
    release_aborted_clears_session=True,
    cites={**R0521.cites,
           "session": "sch 22:3335 door retire; sch 22:3423 _release_aborted_request -> abort_req (bootstrap queue "
                      "sch 22:5531, waiting queue 22:5480); SS 22:165/182",
           "update_status": "cc 22:561-588 (a new room drops ack targets and poison)",
           "ack_targets": "mc 22:2831-2849; cc 22:908-948 per-endpoint targets, poison",
           "arming": "cc 22:2564 ensure_abort_notified; cc 22:843-868 generations",
           "poison": "mc 22:2413-2421, 22:2809",
           "failed_sessions": "env 22:811 probe off; mc 22:2668-2673, 22:2515-2534, "
                              "22:3082-3108 (as 0.5.19), 22:899-901 re-registration",
           "hold": "dc 22:2797-2812",
           "release": "dc 22:2937 per rank for device destinations",
           "requeue_fallback": "pf 22:1720 frees metadata",
           "prefill_door": "pf 22:434-436; ut 22:1854",
           "decode_door": "dc 22:800-802",
           "retire_cleanup": "sch 22:3328",
           "final_result": "pf 22:937",
           "inflight_success": "pf 22:1183",
           "prealloc_scan": "dc 22:1365",
           "commit_check": "dc 22:2507",
           "p_waiting_abort": "pf 22:573",
           "host_receive": "dc 22:748-754; bc 22:130, 22:237 (as 0.5.21)",
           "sender_poll": "mc 22:3205 (as 0.5.19)",
           "handshake": "dc 22:1094-1149 (as 0.5.20)",
           "req_waiting_timeout": "sch 22:3471, called from recv sch 22:2116",
           "timeouts": "env 22:706, 22:710, 22:725 (as 0.5.19)"},
)

R0523 = attrs.evolve(
    R0522,
    name="0.5.23",
    sender_capacity=INTAKE,
    checksum=SUFFIX,
    release_reduced=True,
    clear_slot_resets_checksum=True,
    sender_poll_missing_room_fails=True,
    failed_session_probe_default=True,
    cites={**R0522.cites,
           "session": "sch 23:3462 door retire; sch 23:3550 _release_aborted_request -> "
                      "abort_req (bootstrap queue sch 23:5746, waiting queue 23:5697); "
                      "SS 23:173/190",
           "failed_sessions": "env 23:872 probe ON; mc 23:2740-2745, 23:2583-2606, 23:3154-3204 "
                              "(backoff, and a session no request targeted for 600 s dropped), "
                              "thread 23:374-377, 23:3143 re-registration",
           "ack_targets": "mc 23:2903; cc 23:1044-1084 (as 0.5.22)",
           "arming": "cc 23:2965; cc 23:979-1000",
           "poison": "mc 23:2486, 23:2881",
           "hold": "dc 23:2906, all_reduce_flags(MAX) dc 23:2959",
           "release": "dc 23:3046-3090 readiness MIN-reduced over ranks",
           "prefill_door": "pf 23:457-459; ut 23:1941",
           "decode_door": "dc 23:824-826",
           "retire_cleanup": "sch 23:3455, _release_aborted_request sch 23:3545-3550",
           "final_result": "pf 23:980",
           "inflight_success": "pf 23:1226",
           "prealloc_scan": "dc 23:1395",
           "commit_check": "dc 23:2600",
           "p_waiting_abort": "pf 23:595",
           "create_sender": "pf 23:148-155 (max_input_len)",
           "requeue_fallback": "pf 23:1841 frees metadata",
           "checksum": "dc 23:2580-2598 layout signature",
           "clear_slot": "ut 23:517-522 (dc 23:2987, 3024)",
           "host_receive": "dc 23:772-778; bc 23:135, 23:249 (as 0.5.21)",
           "sender_poll": "cc 23:2353-2356 a missing room polls Failed",
           "handshake": "dc 23:1124-1179 (as 0.5.20)",
           "req_waiting_timeout": "sch 23:3598-3620, called from recv sch 23:2202",
           "timeouts": "env 23:759, 23:763, 23:778 (as 0.5.19)"},
)

RELEASES: Dict[str, Release] = {r.name: r for r in (R0519, R0520, R0521, R0522, R0523)}
NAMES: Tuple[str, ...] = tuple(RELEASES)


def get(name: str) -> Release:
    try:
        return RELEASES[name]
    except KeyError:
        raise ReleaseError(f"unknown release {messages.short(name, 40)} "
                           f"(known: {', '.join(NAMES)})") from None


def resolve(spec: str) -> Tuple[Release, ...]:
    """``all`` or a comma-separated list of release names."""
    if spec == "all":
        return tuple(RELEASES.values())
    parts = [part.strip() for part in spec.split(",")]
    if not all(parts):
        raise ReleaseError(f"an empty release name in {spec[:60]!r} (give names such as "
                           "0.5.19,0.5.20, or all)")
    return tuple(get(part) for part in parts)
