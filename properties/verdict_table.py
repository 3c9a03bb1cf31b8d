"""The expected verdicts, as data.

``REFERENCE`` is §8 of the modelling reference, cell by cell, with the
scenario each shortest counterexample needs and the shortest length the
exhaustive checker finds (pinned, so a change in minimality is a failure).
``H*`` cells of the reference are ``holds`` here: the latent paths they name
have no caller in the model either.

``ESTABLISHED`` are cells the reference does not give or where the model,
read against the released code, disagrees with it; notes/verdicts.md gives the
evidence for each.  Values: "H" holds, "F<n>" violated with a shortest trace
of n steps, "-" not applicable, "R<n>" reachable in n steps, "U" unreachable.
"""

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")

# property -> (scenario, [cell per release])
REFERENCE = {
    "no-foreign-kv-read": ("incident", ["F29", "H", "H", "H", "H"]),
    "rejected-never-succeeds": ("incident", ["F12", "H", "H", "H", "H"]),
    "pending-abort-not-overwritten": ("incident", ["F12", "H", "H", "H", "H"]),
    "no-late-result-side-effects": ("late-result-unit", ["F9", "H", "H", "H", "H"]),
    "abort-is-terminal": ("optimistic-abort-unit", ["F14", "H", "H", "H", "H"]),
    "reject-acquires-nothing": ("incident", ["F2", "F2", "H", "H", "H"]),
    "release-exactly-once": ("late-result-unit", ["F9", "H", "H", "H", "H"]),
    "early-retire-runs-cleanup": ("incident", ["-", "-", "H", "H", "H"]),
    "reentry-not-retired": ("retract-abort", ["-", "-", "H", "H", "H"]),
    "aborted-not-preallocated": ("decode-reject", ["F3", "F3", "H", "H", "H"]),
    "valid-request-completes": ("incident", ["R16", "R16", "R16", "R16", "R16"]),
    "reentry-can-resume": ("retract-abort", ["R19", "R19", "R19", "R19", "R19"]),
}

# (property, scenario) -> cells: what the model establishes beyond the table
ESTABLISHED = {
    # the reference's F on 0.5.19 needs results processed out of the overlap
    # loop's order; in the loop (pf 19:599-640) it cannot happen
    ("no-late-result-side-effects", "late-result"): ["H", "H", "H", "H", "H"],
    ("release-exactly-once", "late-result"): ["H", "H", "H", "H", "H"],
    ("abort-is-terminal", "optimistic-abort"): ["H", "H", "H", "H", "H"],
    # both workers reject: 0.5.20 already retires the stub's final result
    ("rejected-never-succeeds", "both-reject"): ["F12", "H", "H", "H", "H"],
    ("rejected-never-succeeds", "decode-reject"): ["H", "H", "H", "H", "H"],
    ("aborted-not-preallocated", "both-reject"): ["F3", "F3", "H", "H", "H"],
    # auto-truncate with unequal pools: no release compares lengths (#38704)
    ("no-foreign-kv-read", "auto-truncate"): ["F30", "F30", "F30", "F30", "F30"],
    # ... the checksum (0.5.21+, both roles) catches it before attention
    ("no-foreign-kv-read", "auto-truncate-checksum"): ["F30", "F30", "H", "H", "H"],
    # an abort racing the handoff: decode frees pages a late chunk still writes
    # (deferral off by default before 0.5.21)
    ("no-foreign-kv-read", "optimistic-abort-unit"): ["H", "H", "H", "H", "H"],
    ("no-foreign-kv-read", "late-result"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "decode-reject"): ["-", "-", "-", "-", "-"],
    # R2 pause-retract of a request with a pending method-3 abort: the door is
    # skipped on is_rebootstrap and D2 reads only finished_reason (all releases)
    ("aborted-not-preallocated", "pause-abort"): ["F18", "F18", "F18", "F18", "F18"],
    ("reentry-not-retired", "pause-abort"): ["-", "-", "H", "H", "H"],
    ("reentry-can-resume", "pause-abort"): ["R30", "R30", "R30", "R30", "R30"],
    # ... decode's overlap scheduler (SGLang's default) processes the last
    # batch first, which promotes the pending abort (sch 21:5603-5606)
    ("aborted-not-preallocated", "pause-abort-overlap"): ["H", "H", "H", "H", "H"],
    ("reentry-can-resume", "pause-abort-overlap"): ["R30", "R30", "R30", "R30", "R30"],
    # issue #3, lifetime and ownership (notes/verdicts.md, "Lifetime")
    # a KV chunk lands in a decode page handed to another request: decode frees
    # an aborted request's pages at once (deferral off before 0.5.21), or when
    # the 30 s deferral times out (0.5.21+); or, when a send's batch fails with
    # the write still running, at once (deferral off before 0.5.21) or on the
    # drain ack prefill sends after giving up on the batch (0.5.21; 0.5.22+
    # poison the room, so no ack comes)
    ("no-reuse-during-inflight-write", "inflight-reuse"): ["F16", "F16", "F17", "F17", "F17"],
    ("no-reuse-during-inflight-write", "optimistic-abort-unit"): ["F16", "F16", "H", "H", "H"],
    ("no-reuse-during-inflight-write", "incident"): ["H", "H", "H", "H", "H"],
    ("no-reuse-during-inflight-write", "transfer-failure"): ["F17", "F17", "F19", "H", "H"],
    ("no-reuse-during-inflight-write", "retract-abort"): ["H", "H", "H", "H", "H"],
    # with the defaults the failed batch lists decode's session on prefill's
    # failed list and the next request's chunk fails early (0.5.19-0.5.22);
    # 0.5.23's probe (on by default) takes it off, but 0.5.22+ poison the room
    ("no-foreign-kv-read", "transfer-failure"): ["H", "H", "H", "H", "H"],
    # ... with the probe on, the next request is written while the failed
    # batch's write may still land (notes/verdicts.md, "Mooncake's
    # failed-session list")
    ("no-foreign-kv-read", "transfer-failure-probe"): ["F29", "F29", "F31", "H", "H"],
    ("no-reuse-during-inflight-write", "transfer-failure-probe"): ["F17", "F17", "F19", "H", "H"],
    ("answered-without-timeout", "transfer-failure-probe"): ["H", "H", "H", "F21", "F21"],
    # decode's heartbeat declares a live prefill instance lost: up to 0.5.20
    # decode frees request 0's pages at once and prefill's write may land in
    # them after request 1 took them; 0.5.21+ send the ABORT and hold the
    # pages for prefill's drain ack.  On every release, a room failed while
    # decode had not yet sent its metadata leaves prefill's sender waiting
    # for its bootstrap timeout (notes/verdicts.md, "A prefill instance dies")
    ("no-foreign-kv-read", "prefill-silent"): ["F27", "F28", "H", "H", "H"],
    ("no-reuse-during-inflight-write", "prefill-silent"): ["F16", "F17", "H", "H", "H"],
    ("answered-without-timeout", "prefill-silent"): ["F10", "F10", "F10", "F10", "F10"],
    ("valid-request-completes", "prefill-silent"): ["R16", "R16", "R16", "R16", "R16"],
    # ... a dead prefill instance: 0.5.21+ hold its request's pages for an
    # ack that cannot come, and the live instance's request waits for the
    # deferral timeout (30 s) for them
    ("answered-without-timeout", "prefill-dies"): ["H", "H", "F10", "F10", "F10"],
    ("no-foreign-kv-read", "prefill-dies"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "prefill-dies"): ["R16", "R16", "R16", "R16", "R16"],
    # ... the one instance serving both requests dies: nobody waits for a
    # timeout (decode fails the tracked rooms, and gives up on a later
    # request's registration after its 15 fetches), nothing reads a page
    ("answered-without-timeout", "prefill-dies-alone"): ["H", "H", "H", "H", "H"],
    ("no-foreign-kv-read", "prefill-dies-alone"): ["H", "H", "H", "H", "H"],
    # a transfer worker thread raises: its queue is never read again and
    # nothing notices (the process and its /health live on), so both requests
    # wait for a timeout on every release (notes/verdicts.md, "A transfer
    # worker raises")
    ("answered-without-timeout", "transfer-worker-dies"): ["F19", "F19", "F19", "F19", "F19"],
    ("no-foreign-kv-read", "transfer-worker-dies"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "transfer-worker-dies"): ["R16", "R16", "R16", "R16", "R16"],
    # ... and the client of the request the worker died on aborts: 0.5.21+
    # hold its pages for a drain ack that never comes (its chunk is counted
    # outstanding forever; 0.5.22+ also poison the room)
    ("abort-released-without-timeout", "transfer-worker-dies-abort"):
        ["H", "H", "F23", "F23", "F23"],
    ("answered-without-timeout", "transfer-worker-dies-abort"): ["F19", "F19", "F19", "F19", "F19"],
    # ... one request, timeouts on: decode's waiting timeout fails it and
    # sends prefill the ABORT, which ends prefill's wait (it has no timeout
    # past the bootstrap queue): every wait ends (notes/liveness.md); the
    # timeouts' own cells are those of the other timeout scenarios
    # (transfer-status-monotone: 0.5.19's update_status revives a Failed room;
    # room-state-released: notes/verdicts.md, "A transfer worker raises")
    ("every-wait-bounded", "transfer-worker-dies-alone"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "transfer-worker-dies-alone"): ["F10", "F10", "F10", "F10", "F10"],
    ("transfer-status-monotone", "transfer-worker-dies-alone"): ["F7", "H", "H", "H", "H"],
    ("room-state-released", "transfer-worker-dies-alone"): ["F11", "F11", "F12", "F12", "F12"],
    ("no-foreign-kv-read", "transfer-worker-dies-alone"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "transfer-worker-dies-alone"): ["R16", "R16", "R16", "R16", "R16"],
    # every wait the model reaches ends by own steps or a timeout, faults and
    # timeouts fired included (the scenarios that let timeouts fire)
    **{("every-wait-bounded", sc): ["H", "H", "H", "H", "H"] for sc in (
        "inflight-reuse", "late-result", "two-rank-abort", "incident", "transfer-worker-dies",
        "prefill-dies", "prefill-silent", "req-waiting-timeout")},
    ("no-foreign-kv-read", "inflight-reuse"): ["F27", "F27", "F28", "F28", "F28"],
    # ... with MC_TRANSFER_TIMEOUT above the deferral timeout: the same cells,
    # but on 0.5.21+ the write is already running when the client aborts
    # (model/clocks.py; notes/verdicts.md, "Which timeout passes first")
    ("no-foreign-kv-read", "inflight-reuse-long-transfer"): ["F27", "F27", "F28", "F28", "F28"],
    ("no-reuse-during-inflight-write", "inflight-reuse-long-transfer"):
        ["F16", "F16", "F17", "F17", "F17"],
    ("pending-abort-not-overwritten", "inflight-reuse"): ["F13", "H", "H", "H", "H"],
    ("valid-request-completes", "inflight-reuse"): ["R16", "R16", "R16", "R16", "R16"],
    # ... on one prefill instance, into a request that decode retracted and
    # resumed into the aborted request's freed page, its KV restored from host
    # (issue #27, seventh step); the commits wait while a request is retracted
    ("no-foreign-kv-read", "retract-late-write"): ["F31", "F31", "F32", "F32", "F32"],
    ("no-reuse-during-inflight-write", "retract-late-write"): ["F16", "F16", "F17", "F17", "F17"],
    ("pending-abort-not-overwritten", "retract-late-write"): ["F13", "H", "H", "H", "H"],
    ("client-abort-honoured", "retract-late-write"): ["F13", "H", "H", "H", "H"],
    ("room-state-released", "retract-late-write"): ["F11", "F11", "F12", "F12", "F12"],
    ("answered-without-timeout", "retract-late-write"): ["H", "H", "H", "H", "H"],
    ("abort-released-without-timeout", "retract-late-write"): ["H", "H", "H", "H", "H"],
    ("reentry-can-resume", "retract-late-write"): ["R19", "R19", "R19", "R19", "R19"],
    # 0.5.19's update_status lets a later state replace Failed (cc 19:365-380)
    ("transfer-status-monotone", "inflight-reuse"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "late-result"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "late-result-unit"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "optimistic-abort"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "optimistic-abort-unit"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "pause-abort"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "retract-abort"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "retract-late-write"): ["F7", "H", "H", "H", "H"],
    ("transfer-status-monotone", "transfer-failure"): ["H", "H", "H", "H", "H"],
    ("transfer-status-monotone", "incident"): ["H", "H", "H", "H", "H"],
    # decode commits metadata that covers fewer pages than it reserved: no
    # release compares the lengths (#38704)
    ("metadata-integrity", "incident"): ["F13", "H", "H", "H", "H"],
    ("metadata-integrity", "auto-truncate"): ["F13", "F13", "F13", "F13", "F13"],
    ("metadata-integrity", "auto-truncate-checksum"): ["F13", "F13", "F13", "F13", "F13"],
    ("metadata-integrity", "transfer-failure"): ["H", "H", "H", "H", "H"],
    ("metadata-integrity", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    # issue #3, ABORT/ABORT_ACK across decode ranks (notes/verdicts.md): a
    # decode rank left holding without an ack it can count. 0.5.19/0.5.20: the
    # waiting timeout never arms the tracker, clear() drops the target, one
    # target per room; 0.5.21: a later registration overwrites the fan-out
    # snapshot after clear() popped the peers
    ("drain-ack-reaches-every-rank", "two-rank-abort"): ["F8", "F8", "F17", "H", "H"],
    ("drain-ack-reaches-every-rank", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    ("drain-ack-releases-hold", "two-rank-abort"): ["R11", "R11", "R10", "R11", "R11"],
    ("drain-ack-releases-hold", "inflight-reuse"): ["-", "-", "R8", "R8", "R8"],
    ("transfer-status-monotone", "two-rank-abort"): ["F8", "H", "H", "H", "H"],
    ("pending-abort-not-overwritten", "two-rank-abort"): ["F14", "H", "H", "H", "H"],
    # issue #3, control-plane room state: prefill's request_status,
    # transfer_infos and failure_records outlive a request aborted in the
    # waiting queue (sender.abort() without clear()) on every release
    **{("room-state-released", sc): cells for sc, cells in (
        ("inflight-reuse", ["F11", "F11", "F12", "F12", "F12"]),
        ("late-result", ["F11", "F11", "F12", "F12", "F12"]),
        ("late-result-unit", ["F11", "F11", "F12", "F12", "F12"]),
        ("pause-abort", ["F11", "F11", "F12", "F12", "F12"]),
        ("retract-abort", ["F11", "F11", "F12", "F12", "F12"]),
        ("optimistic-abort", ["F9", "F9", "F10", "F9", "F9"]),
        ("optimistic-abort-unit", ["F9", "F9", "F10", "F9", "F9"]),
        ("two-rank-abort", ["F13", "F13", "F14", "F14", "F14"]),
        ("transfer-failure", ["H", "H", "H", "H", "H"]),
        ("incident", ["H", "H", "H", "H", "H"]),
        # room reuse: the later request's entries are checked once it is gone
        ("room-reuse", ["F21", "F21", "F21", "F20", "F20"]),
    )},
    # issue #3, bootstrap_room reuse (notes/verdicts.md, "bootstrap_room
    # reuse"): state is keyed by the room.  A drain ack for the earlier
    # request's ABORT counts in the later request's fresh tracker until
    # 0.5.22's generations; from 0.5.22 the earlier request's hold still reads
    # the room's tracker, which the later request re-armed
    # decode's request_status[room] is the room's: 0.5.19 lets a later
    # request's receiver replace the held request's Failed entry, and the
    # held request's clear() then pops it under the later receiver (KeyError)
    ("no-poll-of-popped-room", "room-reuse"): ["F14", "F14", "F14", "F14", "F14"],
    ("no-poll-of-popped-room", "two-rank-abort"): ["H", "H", "H", "H", "H"],
    ("no-poll-of-popped-room", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    ("ack-belongs-to-its-hold", "room-reuse"): ["F14", "F14", "F14", "F18", "F18"],
    ("ack-belongs-to-its-hold", "two-rank-abort"): ["H", "H", "H", "H", "H"],
    ("ack-belongs-to-its-hold", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    # a status report carries no generation, and the bootstrap thread
    # re-creates a cleared room from the later request's metadata: the earlier
    # request's queued chunk is written into the later request's page and its
    # Success is the later request's, in every release
    ("commit-after-all-ranks", "room-reuse"): ["F22", "F22", "F22", "F22", "F22"],
    ("commit-after-all-ranks", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    ("commit-after-all-ranks", "incident"): ["H", "H", "H", "H", "H"],
    # the earlier request's release pops the tracker the later one armed
    # (0.5.21), or the later arm makes the earlier ack's generation stale
    # (0.5.22+): a hold waits for the 30 s timeout
    ("drain-ack-reaches-every-rank", "room-reuse"): ["F15", "F15", "F19", "F15", "F15"],
    ("drain-ack-releases-hold", "room-reuse"): ["R8", "R8", "R8", "R8", "R8"],
    ("no-reuse-during-inflight-write", "room-reuse"): ["F17", "F17", "F17", "F17", "F17"],
    ("no-foreign-kv-read", "room-reuse"): ["F23", "F23", "F23", "F23", "F23"],
    ("transfer-status-monotone", "room-reuse"): ["F7", "H", "H", "H", "H"],
    ("pending-abort-not-overwritten", "room-reuse"): ["F13", "H", "H", "H", "H"],
    ("valid-request-completes", "room-reuse"): ["R16", "R16", "R16", "R16", "R16"],
    # three requests on one room (notes/verdicts.md, "Larger scenarios"):
    # request 0's failed transfer is held (deferred release, the default from
    # 0.5.21, which also holds a failure decode never sent ABORT for:
    # hold_unnotified, dc 21:2692), request 1 is failed by request 0's late
    # ABORT, request 2's receiver creates decode's request_status entry, and
    # request 0's drain ack pops it under request 2's poll (KeyError)
    ("no-poll-of-popped-room", "room-reuse-three"): ["H", "H", "F18", "F18", "F18"],
    ("drain-ack-reaches-every-rank", "room-reuse-three"): ["H", "H", "H", "F17", "F17"],
    # room-state-released, commit-after-all-ranks and 0.5.19's
    # transfer-status-monotone failed here only while a transfer could fail
    # before prefill queued a chunk, leaving the chunk queued for the room's
    # next lifecycle; they hold since that correction (notes/verdicts.md,
    # "A second modelling correction")
    ("room-state-released", "room-reuse-three"): ["H", "H", "H", "H", "H"],
    ("transfer-status-monotone", "room-reuse-three"): ["H", "H", "H", "H", "H"],
    ("commit-after-all-ranks", "room-reuse-three"): ["H", "H", "H", "H", "H"],
    ("no-reuse-during-inflight-write", "room-reuse-three"): ["F18", "F18", "F20", "F22", "F22"],
    ("no-foreign-kv-read", "room-reuse-three"): ["H", "H", "H", "H", "H"],
    ("ack-belongs-to-its-hold", "room-reuse-three"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "room-reuse-three"): ["R16", "R16", "R16", "R16", "R16"],
    # issue #3, prefill TP = 2 (notes/verdicts.md, "Prefill TP"): decode counts
    # one Success report per prefill rank in prefill_response_tracker[room],
    # which names no request: with a reused room, reports of the earlier
    # request count for the later one (shortest: both stale, the earlier
    # request's queued chunks written into the later request's destinations;
    # tests/test_prefill_tp.py pins the mixed form, one own report and one
    # stale, which the aux room check cannot see)
    ("commit-after-all-ranks", "prefill-tp"): ["F29", "F29", "F29", "F29", "F29"],
    ("no-foreign-kv-read", "prefill-tp"): ["F30", "F30", "F30", "F30", "F30"],
    ("metadata-integrity", "prefill-tp"): ["H", "H", "H", "H", "H"],
    ("ack-belongs-to-its-hold", "prefill-tp"): ["H", "H", "H", "H", "H"],
    ("drain-ack-reaches-every-rank", "prefill-tp"): ["F16", "F16", "H", "F17", "F17"],
    ("drain-ack-releases-hold", "prefill-tp"): ["R11", "R11", "R11", "R11", "R11"],
    ("valid-request-completes", "prefill-tp"): ["R20", "R20", "R20", "R20", "R20"],
    # one prefill rank fails with its write in flight, the other completes;
    # the failed rank's stray write could land in the page the next request
    # took, but the failure lists decode's session on that rank's failed
    # list, so the next request's chunk fails early (0.5.19-0.5.21, probe
    # off by default), and 0.5.22+ poison the room
    ("no-foreign-kv-read", "prefill-tp-failure"): ["H", "H", "H", "H", "H"],
    ("no-reuse-during-inflight-write", "prefill-tp-failure"): ["F18", "F18", "F22", "H", "H"],
    ("commit-after-all-ranks", "prefill-tp-failure"): ["H", "H", "H", "H", "H"],
    ("drain-ack-reaches-every-rank", "prefill-tp-failure"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "prefill-tp-failure"): ["R20", "R20", "R20", "R20", "R20"],
    # ---- issue #22: hangs, spins and crashes (notes/liveness.md; readings in
    # notes/verdicts.md, "Hangs, spins and crashes")
    ("answered-without-timeout", "auto-truncate"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "auto-truncate-checksum"): ["H", "H", "H", "H", "H"],
    # prefill retires the stub's final result and tells decode nothing (0.5.20); #38935's doors answer both at once (0.5.21+)
    ("answered-without-timeout", "both-reject"): ["H", "F9", "H", "H", "H"],
    # #38935: decode's door retires a prompt prefill accepted; prefill waits for its 300 s bootstrap timeout
    ("answered-without-timeout", "decode-reject"): ["H", "H", "F4", "F4", "F4"],
    # a prefill-side reject never reaches decode, which waits for its 300 s waiting timeout
    ("answered-without-timeout", "incident"): ["H", "F25", "F22", "F22", "F22"],
    ("answered-without-timeout", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "late-result"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "late-result-unit"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "optimistic-abort"): ["H", "H", "H", "H", "H"],
    # result_timing any: a yielded request whose middle result was processed before the yield (the loop cannot order it so)
    ("answered-without-timeout", "optimistic-abort-unit"): ["F26", "F26", "F26", "F26", "F26"],
    # #31473: each worker holds the pages the other needs
    ("answered-without-timeout", "optimistic-tight"): ["F14", "F14", "F14", "F14", "F14"],
    ("answered-without-timeout", "pause-abort"): ["F21", "F21", "F21", "F21", "F21"],
    ("answered-without-timeout", "prefill-reject"): ["H", "F9", "F6", "F6", "F6"],
    ("answered-without-timeout", "prefill-tp"): ["F19", "F19", "F19", "F17", "F17"],
    ("answered-without-timeout", "prefill-tp-failure"): ["H", "H", "H", "F24", "F25"],
    ("answered-without-timeout", "retract-abort"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "room-reuse"): ["F17", "F17", "F17", "F16", "F16"],
    ("answered-without-timeout", "room-reuse-three"): ["H", "H", "F22", "F20", "F21"],
    # 0.5.23's failed-session probe (on by default) must have run for the
    # state to wait for nothing but a timeout: one step longer than 0.5.22
    ("answered-without-timeout", "transfer-failure"): ["H", "H", "H", "F20", "F21"],
    ("answered-without-timeout", "two-rank-abort"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "two-valid"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "auto-truncate"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "auto-truncate-checksum"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "both-reject"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "decode-reject"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "incident"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "late-result"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "late-result-unit"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "optimistic-abort"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "optimistic-abort-unit"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "optimistic-tight"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "pause-abort"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "prefill-reject"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "prefill-tp"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "prefill-tp-failure"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "retract-abort"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "room-reuse"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "room-reuse-three"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "transfer-failure"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "two-rank-abort"): ["H", "H", "H", "H", "H"],
    ("no-livelock", "two-valid"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "auto-truncate"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "auto-truncate-checksum"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "both-reject"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "decode-reject"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "incident"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "inflight-reuse"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "late-result"): ["H", "H", "H", "H", "H"],
    # 0.5.19: release_kv_cache on a late result's request that holds no KV
    ("no-scheduler-crash", "late-result-unit"): ["F10", "H", "H", "H", "H"],
    ("no-scheduler-crash", "optimistic-abort"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "optimistic-abort-unit"): ["F13", "H", "H", "H", "H"],
    ("no-scheduler-crash", "optimistic-tight"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "pause-abort"): ["F22", "H", "H", "H", "H"],
    ("no-scheduler-crash", "prefill-reject"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "prefill-tp"): ["F17", "F17", "F17", "F17", "F17"],
    ("no-scheduler-crash", "prefill-tp-failure"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "retract-abort"): ["H", "H", "H", "H", "H"],
    # an earlier request's write lands Success on the room a new sender opened: pop_bootstrapped raises
    ("no-scheduler-crash", "room-reuse"): ["F14", "F14", "F14", "F14", "F14"],
    ("no-scheduler-crash", "room-reuse-three"): ["H", "H", "F18", "F18", "F18"],
    ("no-scheduler-crash", "transfer-failure"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "two-rank-abort"): ["H", "H", "H", "H", "H"],
    ("no-scheduler-crash", "two-valid"): ["H", "H", "H", "H", "H"],
    ("metadata-integrity", "prefill-reject"): ["F13", "H", "H", "H", "H"],
    ("pending-abort-not-overwritten", "prefill-reject"): ["F12", "H", "H", "H", "H"],
    ("reject-acquires-nothing", "prefill-reject"): ["F2", "F2", "H", "H", "H"],
    ("rejected-never-succeeds", "prefill-reject"): ["F12", "H", "H", "H", "H"],
    ("valid-request-completes", "optimistic-tight"): ["R16", "R16", "R16", "R16", "R16"],
    ("valid-request-completes", "two-valid"): ["R16", "R16", "R16", "R16", "R16"],
    # issue #23: what the client may expect once its abort reached a worker.
    # 0.5.19: the final result drops a pending abort (I5) and the request is
    # answered 200; every release: an abort for a decode request held for
    # rebootstrap (pause_generation -> continue_generation) is in no list
    # abort_request scans, and the request is recomputed and decoded
    **{("client-abort-honoured", sc): cells for sc, cells in (
        ("abort-reaches-decode", ["H", "H", "H", "H", "H"]),
        ("abort-reaches-prefill", ["F13", "H", "H", "H", "H"]),
        ("inflight-reuse", ["F13", "H", "H", "H", "H"]),
        ("optimistic-abort", ["F15", "H", "H", "H", "H"]),
        ("optimistic-abort-unit", ["F15", "H", "H", "H", "H"]),
        ("pause-abort", ["F13", "F30", "F30", "F30", "F30"]),
        ("pause-abort-overlap", ["F13", "F30", "F30", "F30", "F30"]),
        ("prefill-tp", ["F16", "H", "H", "H", "H"]),
        ("retract-abort", ["F13", "H", "H", "H", "H"]),
        ("room-reuse", ["F13", "H", "H", "H", "H"]),
        ("two-rank-abort", ["F14", "H", "H", "H", "H"]),
    )},
    # issue #23: an aborted request held by a worker until a timeout.  Only
    # the abort reaching one worker is new (abort-reaches-*); the rest are
    # the findings of drain-ack-reaches-every-rank (a lost drain ack, 30 s),
    # of the pause's recompute (lost metadata, 300 s), of 0.5.19's dropped
    # pending abort and of an abort to a yielded request no queue holds
    # (result_timing = "any"), read in notes/verdicts.md
    **{("abort-released-without-timeout", sc): cells for sc, cells in (
        ("abort-reaches-decode", ["F7", "F7", "F8", "F7", "F7"]),
        ("abort-reaches-prefill", ["F8", "F8", "F8", "F8", "F8"]),
        ("inflight-reuse", ["H", "H", "H", "H", "H"]),
        ("optimistic-abort", ["F13", "H", "H", "H", "H"]),
        ("optimistic-abort-unit", ["F27", "F27", "F28", "F27", "F27"]),
        ("pause-abort", ["F23", "F23", "F23", "F23", "F23"]),
        ("pause-abort-overlap", ["F23", "F23", "F23", "F23", "F23"]),
        ("prefill-tp", ["F24", "F22", "H", "F23", "F23"]),
        ("retract-abort", ["H", "H", "H", "H", "H"]),
        ("room-reuse", ["F22", "F22", "F22", "F22", "F22"]),
        ("two-rank-abort", ["F18", "F17", "F18", "H", "H"]),
    )},
    # reuse_room_after = "decode": request 1 opens the room while prefill still holds request 0
    ("no-scheduler-crash", "room-reuse-early"): ["H", "H", "H", "H", "H"],
    ("answered-without-timeout", "room-reuse-early"): ["F22", "F22", "F22", "F22", "F22"],
    ("no-livelock", "room-reuse-early"): ["H", "H", "H", "H", "H"],
    ("valid-request-completes", "room-reuse-early"): ["R16", "R16", "R16", "R16", "R16"],
    # issue #23: room_users = "concurrent", two users of one room in flight at
    # once (n > 1 samples, or two clients' requests with one room).  Decode
    # commits a request on the other's transfer (cross-pairing: the foreign
    # read, the write into pages another request owns, the commit on another
    # request's report); a later user's poll reads the earlier one's Success
    # (pop_bootstrapped raises) or its popped entry (KeyError); a later user
    # that opens the room after the earlier one's transfer waits for a timeout
    **{(prop, "room-concurrent"): cells for prop, cells in (
        ("no-foreign-kv-read", ["F14", "F14", "F14", "F14", "F14"]),
        ("no-reuse-during-inflight-write", ["F11", "F11", "F11", "F11", "F11"]),
        ("commit-after-all-ranks", ["F13", "F13", "F13", "F13", "F13"]),
        ("metadata-integrity", ["H", "H", "H", "H", "H"]),
        ("no-poll-of-popped-room", ["F16", "F16", "F16", "F16", "F16"]),
        ("no-scheduler-crash", ["F14", "F14", "F14", "F14", "F14"]),
        ("room-state-released", ["H", "H", "H", "H", "H"]),
        ("answered-without-timeout", ["F22", "F22", "F22", "F22", "F22"]),
        ("no-livelock", ["H", "H", "H", "H", "H"]),
        ("valid-request-completes", ["R16", "R16", "R16", "R16", "R16"]),
    )},
    # parallel sampling (n = 2) with a metadata buffer per sample on both
    # workers, so both samples reach decode's transfer queue: the first
    # pop_transferred that commits one latches the other's Success, which the
    # metadata gate then holds back for good (only one slot is ever written:
    # prefill keeps one destination per room); no timeout is armed on a
    # latched receiver.  The other cells are room-concurrent's, and every
    # release leaves prefill's room entry behind when a sample's metadata
    # arrives after the room was concluded and cleared: it re-creates the
    # entry (transfer_infos, request_status) and no sender is left to clear it
    **{(prop, "parallel-samples"): cells for prop, cells in (
        ("every-wait-bounded", ["F25", "F25", "F25", "F25", "F23"]),
        ("no-foreign-kv-read", ["F14", "F14", "F14", "F14", "F14"]),
        ("no-reuse-during-inflight-write", ["F11", "F11", "F11", "F11", "F11"]),
        ("commit-after-all-ranks", ["F13", "F13", "F13", "F13", "F13"]),
        ("no-poll-of-popped-room", ["F16", "F16", "F16", "F16", "F16"]),
        ("no-scheduler-crash", ["F14", "F14", "F14", "F14", "F14"]),
        ("room-state-released", ["F32", "F32", "F32", "F32", "F32"]),
        ("answered-without-timeout", ["F22", "F22", "F22", "F22", "F22"]),
        ("metadata-integrity", ["H", "H", "H", "H", "H"]),
        ("no-livelock", ["H", "H", "H", "H", "H"]),
        ("valid-request-completes", ["R16", "R16", "R16", "R16", "R16"]),
    )},
    # a reused room: the earlier request's Success report, late, lands on the
    # next user's fresh entry; the next receiver latches it and its slot is
    # never written (prefill failed the next user on the earlier ABORT)
    ("every-wait-bounded", "room-reuse"): ["F25", "F25", "F25", "F25", "F25"],
    # issue #23: each worker digests its own KV buffers, so with another TP
    # width, PP stage, page size or dtype on prefill the digests differ for
    # good KV; 0.5.23 skips the comparison on a layout-signature mismatch
    ("no-false-corruption-abort", "checksum-layouts"): ["H", "H", "F14", "F14", "H"],
    ("valid-request-completes", "checksum-layouts"): ["R16", "R16", "U", "U", "R16"],
    # ... and decode's checksum abort of a page prefill never wrote is right
    ("no-false-corruption-abort", "auto-truncate-checksum"): ["H", "H", "H", "H", "H"],
    # issue #51: decode's ranks deciding alone.  Up to 0.5.22 each decode
    # rank ends a failed transfer's hold on its own drain ack, and
    # pop_preallocated admits the next request from each rank's own pool:
    # the ranks split.  0.5.23 agrees on the hold and reduces the release.
    # The other violations are two-rank-abort's families (the lost drain
    # ack, which here also keeps request 1 waiting for the 30 s deferral;
    # 0.5.19's pending abort and status regression) and the room-state one
    **{(prop, "rank-admission"): cells for prop, cells in (
        ("ranks-stay-in-step", ["F11", "F11", "F11", "F11", "H"]),
        ("no-scheduler-crash", ["H", "H", "H", "H", "H"]),
        ("no-foreign-kv-read", ["H", "H", "H", "H", "H"]),
        ("no-reuse-during-inflight-write", ["H", "H", "H", "H", "H"]),
        ("pending-abort-not-overwritten", ["F14", "H", "H", "H", "H"]),
        ("client-abort-honoured", ["F14", "H", "H", "H", "H"]),
        ("transfer-status-monotone", ["F8", "H", "H", "H", "H"]),
        ("drain-ack-reaches-every-rank", ["F16", "F16", "F17", "H", "H"]),
        ("room-state-released", ["F14", "F14", "F14", "F14", "F14"]),
        ("answered-without-timeout", ["F22", "F21", "H", "H", "H"]),
        ("abort-released-without-timeout", ["F22", "F21", "F35", "H", "H"]),
        ("valid-request-completes", ["R17", "R17", "R17", "R17", "R17"]),
        ("drain-ack-releases-hold", ["R11", "R11", "R10", "R11", "R11"]),
    )},
    # issue #23: SGLANG_REQ_WAITING_TIMEOUT (0.5.20+) aborts on prefill only:
    # decode holds its pages until its own 300 s waiting timeout
    ("abort-released-without-timeout", "req-waiting-timeout"): ["H", "F8", "F8", "F8", "F8"],
    ("client-abort-honoured", "req-waiting-timeout"): ["H", "H", "H", "H", "H"],
    # what each worker's first answer tells the client ended the request
    # (notes/verdicts.md, "What the client is told"): a client's abort that
    # finds the request in a handoff queue (prefill's bootstrap or inflight
    # queue, decode's prealloc or transfer queue) only calls abort() on the
    # sender or receiver, and the next scan answers the failure's 500, on
    # every release; 0.5.19's rejected stub is answered 200 (the incident);
    # a rejection at the door, the waiting timeout's own abort, failures and
    # completions are answered as what they are
    **{("answer-matches-cause", sc): cells for sc, cells in (
        ("abort-reaches-decode", ["F4", "F4", "F4", "F4", "F4"]),
        ("abort-reaches-prefill", ["F4", "F4", "F4", "F4", "F4"]),
        ("incident", ["F12", "H", "H", "H", "H"]),
        ("decode-reject", ["H", "H", "H", "H", "H"]),
        ("req-waiting-timeout", ["H", "H", "H", "H", "H"]),
        ("transfer-failure", ["H", "H", "H", "H", "H"]),
        ("two-valid", ["H", "H", "H", "H", "H"]))},
    # a streaming session's in-flight mark (notes/verdicts.md, "What a
    # session is left with"): cleared only through release_kv_cache on a
    # request holding KV, the door's retire (0.5.21+) and
    # _release_aborted_request (0.5.22+); a client's abort in decode's
    # prealloc queue (and before 0.5.22 prefill's bootstrap queue) ends the
    # request without KV and leaves it set; 0.5.19's session requests are not
    # PD requests (not applicable)
    **{("session-mark-released", sc): cells for sc, cells in (
        ("pause-abort", ["-", "F4", "F4", "F4", "F4"]),
        ("pause-abort-overlap", ["-", "F4", "F4", "F4", "F4"]),
        ("retract-abort", ["-", "F4", "F4", "F4", "F4"]),
        ("incident", ["-", "H", "H", "H", "H"]),
        ("both-reject", ["-", "H", "H", "H", "H"]),
        ("decode-reject", ["-", "H", "H", "H", "H"]))},
    ("valid-request-completes", "req-waiting-timeout"): ["R16", "R16", "R16", "R16", "R16"],
}

# mutant -> (property, scenario, cell): each property that holds on every real
# release is shown to fail on a deliberately wrong guard
MUTANT_CELLS = {
    ("naive-door", "reentry-not-retired", "retract-abort"): "F",
    # ... and the retired request's host backup is never freed (issue #23:
    # the backup is a resource of release-exactly-once)
    ("naive-door", "release-exactly-once", "retract-abort"): "F",
    ("door-without-cleanup", "early-retire-runs-cleanup", "incident"): "F",
    ("deny-all", "valid-request-completes", "incident"): "U",
    ("deny-all", "reentry-can-resume", "retract-abort"): "U",
    ("generation-less-aborts", "drain-ack-releases-hold", "two-rank-abort"): "U",
    ("generation-less-aborts", "drain-ack-reaches-every-rank", "two-rank-abort"): "F",
    # an optimistic requeue that spends no attempt: request 0 yields, is
    # requeued and forwards again for ever (a lasso)
    ("requeue-forever", "no-livelock", "optimistic-tight"): "F",
    # decode's prealloc scan drops every request and tells prefill nothing:
    # prefill waits for its 300 s bootstrap timeout on two valid requests
    ("drop-every-prealloc", "answered-without-timeout", "two-valid"): "F",
    # decode's waiting timeout tells prefill nothing: after it, prefill's
    # request waits in the inflight queue for a chunk a dead worker took,
    # with no timeout armed (prefill has none past the bootstrap queue)
    ("silent-waiting-timeout", "every-wait-bounded", "transfer-worker-dies-alone"): "F",
    # 0.5.23 without 0.5.20's abort check on the final result: the retired
    # request's late result reaches release_kv_cache's assertion
    ("unchecked-final-result", "no-scheduler-crash", "late-result-unit"): "F",
    # the fix session-turn-left-in-flight asks for: every exit without KV
    # also ends the streaming session's turn, and the property holds where
    # 0.5.23 fails it
    ("session-abort-on-every-exit", "session-mark-released", "pause-abort"): "H",
    ("session-abort-on-every-exit", "session-mark-released", "retract-abort"): "H",
    # the fix client-abort-answered-as-failure asks for: a handoff queue's
    # entry gets the abort's own verdict, which the failure paths keep (a
    # pause that loses the abort, abort-lost-while-paused, still fails it)
    ("abort-verdict-kept", "answer-matches-cause", "abort-reaches-decode"): "H",
    ("abort-verdict-kept", "answer-matches-cause", "abort-reaches-prefill"): "H",
    ("abort-verdict-kept", "answer-matches-cause", "transfer-worker-dies-abort"): "H",
}


def violated_cells():
    """Every (property, scenario, release) the tables say is violated."""
    for prop, (sc, row) in REFERENCE.items():
        for rel, c in zip(RELEASES, row):
            if c.startswith("F"):
                yield prop, sc, rel
    for (prop, sc), row in ESTABLISHED.items():
        for rel, c in zip(RELEASES, row):
            if c.startswith("F"):
                yield prop, sc, rel


def pinned_row(prop: str, sc: str):
    """The cells pinned for ``prop`` on ``sc``, one per release, or None."""
    row = ESTABLISHED.get((prop, sc))
    if row is None and REFERENCE.get(prop, (None,))[0] == sc:
        row = REFERENCE[prop][1]
    return row


def pinned_length(prop: str, sc: str, rel: str) -> int:
    """The shortest counterexample length a violated cell pins ("F<n>");
    test_verdicts.py checks every pinned cell against the explorer."""
    cell = pinned_row(prop, sc)[RELEASES.index(rel)]
    assert cell.startswith("F"), (prop, sc, rel, cell)
    return int(cell[1:])
