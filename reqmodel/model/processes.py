"""The processes of a PD deployment, as the code has them: which loop or
thread of which worker runs each action, and, for the two scheduler loops,
the phases of one iteration in the code's order.

The actions (``model/actions/``) stay the unit of a step; this module says
whose step each one is.  ``model/actions/intake.py`` reads the prefill loop's
order through :data:`PREFILL_LOOP` (a request sent after an answer waits for
the inflight scan that the loop runs before its next intake), and
``traces/order.py`` checks every trace against the same data with its own
happens-before relation (``tests/test_order.py`` runs it over the corpus).

The prefill loop, per release (``pf`` = ``disaggregation/prefill.py``;
``normal`` / ``overlap`` = ``event_loop_normal_disagg_prefill`` /
``event_loop_overlap_disagg_prefill``), every iteration in this order:

1. ``ingest``: ``recv_requests`` + ``process_input_requests`` (0.5.19), or
   ``ingest_requests`` (0.5.20+): new requests reach
   ``PrefillBootstrapQueue.add``, aborts reach the queues;
   then ``if self._engine_paused: continue`` skips every other phase;
2. ``bootstrap``: ``pop_bootstrapped`` (one poll all-reduce over the whole
   bootstrap queue, then each entry in queue order);
3. ``batch``: ``get_next_disagg_prefill_batch_to_run`` and ``run_batch``
   (the forward: long, and not atomic with respect to anything);
4. ``result``: ``process_batch_result`` (overlap: the previous batch's);
5. ``inflight``: ``process_disagg_prefill_inflight_queue`` (one poll
   all-reduce over the whole inflight queue, then each entry), then
   ``last_batch = batch`` and back to 1.

0.5.22 and 0.5.23's overlap loop has one more way back to 1 without 5:
with ``SGLANG_ENABLE_DISAGG_PREFILL_CONTINUOUS_INPUT_POLLING=1`` (off by
default, env 22:664, 23:715; and only with attention DP = CP = 1) it
``continue``s while the oldest batch result is not ready
(pf 22:802-813, 23:838-852).  The model runs neither a paused prefill nor
that option; both are in :data:`PREFILL_LOOP` as the ways the loop skips
its inflight scan, so that a scenario that adds them lifts the assumption
below with them.

The decode loop, per release (``dc`` = ``disaggregation/decode.py``;
``event_loop_normal_disagg_decode`` / ``event_loop_overlap_disagg_decode``,
both calling ``process_decode_queue``), every iteration in this order:

1. ``ingest``: as prefill's, then ``if self._engine_paused: continue``
   (from ``pause_generation(mode="retract")``, which retracted every running
   request into ``held_rebootstrap_reqs``, to ``continue_generation``, which
   re-adds them: every phase below is skipped; :data:`DECODE_LOOP`
   ``.returns_early``);
2. ``release``: ``resolve_deferred_releases`` (every iteration);
3. ``resume``: ``resume_retracted_reqs``; then, while the retracted queue
   is not empty, ``process_decode_queue`` returns (":data:`DECODE_LOOP`
   .returns_early``): no prealloc and no transfer scan that iteration;
4. ``prealloc``: ``pop_preallocated`` (one handshake poll all-reduce over
   the prealloc queue, then the abort scan and admission in queue order);
5. ``transfer``: ``pop_transferred`` (one poll all-reduce over the transfer
   queue; each receiver's ``poll()`` is also where its waiting timeout is
   noticed, mc 21:3031-3039, cc 23:2609);
6. ``batch``: ``get_next_disagg_decode_batch_to_run`` (the prebuilt batch,
   0.5.21+'s checksum check, retraction under memory pressure) and
   ``run_batch``;
7. ``result``: ``process_batch_result`` (overlap: the previous batch's).

With ``--disaggregation-decode-host-receive-threshold`` set (0.5.21+, not
the default) the prealloc scan runs after the transfer scan; the model
follows the default order.
"""
from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

import attrs

from reqmodel.model.state import DStage, PStage, State


@attrs.frozen
class Loop:
    """A scheduler loop: its phases in the code's order, per release the code
    lines of each, and the one timing assumption made about it."""

    name: str
    phases: Tuple[str, ...]
    # per release: (normal loop lines, overlap loop lines) of each phase, pf
    lines: Tuple[Tuple[str, Dict[str, str]], ...]
    # the phases after which the loop comes back to its intake waiting for
    # no other process: a scan there is atomic with respect to an event that
    # must first cross another process and come back as a new request
    scan_before_intake: Tuple[str, ...]
    # the code's ways back to intake that skip those scans (none modelled)
    skips: Tuple[str, ...]
    # (condition, the phases the loop skips while it holds): a ``continue``
    # or ``return`` in the middle of an iteration, modelled: the registry
    # gates every action of those phases on it (``actions.core.action``), and
    # ``traces/order.py`` checks every trace against it
    returns_early: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()


PREFILL_LOOP = Loop(
    name="prefill.scheduler",
    phases=("ingest", "bootstrap", "batch", "result", "inflight"),
    lines=(
        ("0.5.19", {"ingest": "pf 19:599-600 / 19:638-639", "paused": "pf 19:601 / 19:640",
                    "bootstrap": "pf 19:604 / 19:643", "batch": "pf 19:608-622 / 19:647-661",
                    "result": "pf 19:623 / 19:670", "inflight": "pf 19:627 / 19:675"}),
        ("0.5.20", {"ingest": "pf 20:620 / 20:659", "paused": "pf 20:621 / 20:660",
                    "bootstrap": "pf 20:625 / 20:664", "batch": "pf 20:629-643 / 20:668-682",
                    "result": "pf 20:644 / 20:691", "inflight": "pf 20:648 / 20:696"}),
        ("0.5.21", {"ingest": "pf 21:673 / 21:716", "paused": "pf 21:674 / 21:717",
                    "bootstrap": "pf 21:678 / 21:721", "batch": "pf 21:682-696 / 21:725-739",
                    "result": "pf 21:697 / 21:749", "inflight": "pf 21:702 / 21:754"}),
        ("0.5.22", {"ingest": "pf 22:669 / 22:755-757", "paused": "pf 22:670 / 22:758",
                    "bootstrap": "pf 22:674 / 22:762", "batch": "pf 22:678-692 / 22:776-795",
                    "result": "pf 22:693 / 22:816", "inflight": "pf 22:698 / 22:821",
                    "continuous_input_polling": "pf 22:802-813 (env 22:664, off)"}),
        ("0.5.23", {"ingest": "pf 23:691 / 23:784-786", "paused": "pf 23:692 / 23:788",
                    "bootstrap": "pf 23:696 / 23:792", "batch": "pf 23:700-714 / 23:806-825",
                    "result": "pf 23:715 / 23:855", "inflight": "pf 23:720 / 23:860",
                    "continuous_input_polling": "pf 23:838-852 (env 23:715, off)"}),
    ),
    scan_before_intake=("inflight",),
    skips=("paused", "continuous_input_polling"),
)

DECODE_LOOP = Loop(
    name="decode.scheduler",
    phases=("ingest", "release", "resume", "prealloc", "transfer", "batch", "result"),
    lines=(
        ("0.5.19", {"ingest": "dc 19:2459-2460 / 19:2502-2503", "paused": "dc 19:2461-2462 / 19:2504-2505",
                    "release": "dc 19:2676", "resume": "dc 19:2679-2680",
                    "retracted_queue": "dc 19:2681-2683", "prealloc": "dc 19:2692-2693",
                    "transfer": "dc 19:2694-2701", "batch": "dc 19:2466-2478 / 19:2509-2528",
                    "result": "dc 19:2479 / 19:2535-2537"}),
        ("0.5.20", {"ingest": "dc 20:2546 / 20:2589", "paused": "dc 20:2547-2549 / 20:2590-2592",
                    "release": "dc 20:2764", "resume": "dc 20:2767-2768",
                    "retracted_queue": "dc 20:2769-2771", "prealloc": "dc 20:2780-2781",
                    "transfer": "dc 20:2782-2789", "batch": "dc 20:2553-2565 / 20:2596-2615",
                    "result": "dc 20:2566 / 20:2622-2624"}),
        ("0.5.21", {"ingest": "dc 21:2885 / 21:2932", "paused": "dc 21:2886-2888 / 21:2933-2935",
                    "release": "dc 21:3181", "resume": "dc 21:3184-3185",
                    "retracted_queue": "dc 21:3186-3188",
                    "prealloc": "dc 21:3197-3199 (threshold set: 21:3208-3211)",
                    "transfer": "dc 21:3200-3207", "batch": "dc 21:2892-2904 / 21:2939-2958",
                    "result": "dc 21:2905 / 21:2966-2968"}),
        ("0.5.22", {"ingest": "dc 22:3030 / 22:3077", "paused": "dc 22:3031-3033 / 22:3078-3080",
                    "release": "dc 22:3324", "resume": "dc 22:3327-3328",
                    "retracted_queue": "dc 22:3329-3331",
                    "prealloc": "dc 22:3340-3342 (threshold set: 22:3351-3354)",
                    "transfer": "dc 22:3343-3350", "batch": "dc 22:3037-3049 / 22:3084-3103",
                    "result": "dc 22:3050 / 22:3111-3113"}),
        ("0.5.23", {"ingest": "dc 23:3135 / 23:3182", "paused": "dc 23:3136-3138 / 23:3183-3185",
                    "release": "dc 23:3467", "resume": "dc 23:3470-3471",
                    "retracted_queue": "dc 23:3472-3474",
                    "prealloc": "dc 23:3483-3485 (threshold set: 23:3494-3497)",
                    "transfer": "dc 23:3486-3493", "batch": "dc 23:3142-3154 / 23:3189-3208",
                    "result": "dc 23:3155 / 23:3216-3218"}),
    ),
    scan_before_intake=(),
    skips=(),
    returns_early=(
        ("paused", ("release", "resume", "prealloc", "transfer", "batch", "result")),
        ("retracted_queue", ("prealloc", "transfer")),
    ),
)
LOOPS = (PREFILL_LOOP, DECODE_LOOP)

def engine_paused(s: State) -> bool:
    """Decode's engine is paused: ``pause_generation(mode="retract")`` held its
    running requests for rebootstrap (``hold_rebootstrap``, dc 19:712-730,
    21:848-867) and sets ``_engine_paused`` (sch 19:5120, 21:5591, 23:5819),
    and ``continue_generation`` re-adds every held request and clears it
    (sch 19:5206-5226, 21:5681-5701, 23:5934-5954).  A request is held for
    rebootstrap exactly while the engine is paused (``d_pause_retract`` to
    the ``d_door`` that re-adds it)."""
    return any(d.stage is DStage.DOOR and d.door_flag == "rebootstrap" for d in s.d)


def retracted_queue(s: State) -> bool:
    """A request waits in decode's retracted queue: ``process_decode_queue``
    runs ``resume_retracted_reqs`` and returns before ``pop_preallocated``
    and ``pop_transferred`` while that queue is not empty ("if there are
    still retracted requests, we do not allocate new requests", dc
    19:2681-2683, 20:2769-2771, 21:3186-3188, 22:3329-3331, 23:3472-3474).
    ``retract_decode`` puts the request there in the same call
    (``_add_request_to_queue(is_retracted=True)``), so a request between
    ``d_retract`` and its ``d_door`` counts too.  The pipeline-parallel
    loop gates only the prealloc queue (``process_prealloc_queue``, pp
    19:1499-1501, 20:1390-1392); the model follows the default loop,
    without ``--pp-size``.  Found by reading the wheels along a re-entry
    trace that needed a commit while a request was retracted
    (notes/verdicts.md)."""
    return any(d.stage is DStage.RETRACTED
               or (d.stage is DStage.DOOR and d.door_flag == "retracted") for d in s.d)


# the conditions of ``Loop.returns_early``, on the state a step starts from
CONDITIONS: Dict[str, Callable[[State], bool]] = {
    "paused": engine_paused, "retracted_queue": retracted_queue}
# and in words, for why_not and the trace checker
WHILE: Dict[str, str] = {
    "paused": "the engine is paused (pause_generation until continue_generation)",
    "retracted_queue": "a request waits in the retracted queue"}

# Whose step each action is, by process and, for the prefill loop, by phase
# (None: no phase of its own). A process is a worker's scheduler loop or one
# of its KV manager's threads; the client's sends are not steps of their own
# (an intake step is the scheduler taking in what the client sent).
_STEPS: Dict[str, Dict[Optional[str], Tuple[str, ...]]] = {
    "prefill.scheduler": {
        "ingest": ("p_intake", "p_door", "p_abort", "p_recompute"),
        "bootstrap": ("p_pop_bootstrapped", "p_bootstrap_timeout"),
        "batch": ("p_resolve_waiting", "p_forward", "p_check_chunked", "p_chunked_abort",
                  "p_req_waiting_timeout"),
        "result": ("p_result",),
        "inflight": ("p_inflight",),
        # polls that raise: the phase is that of the queue the request is in
        None: ("p_poll_popped_room", "p_unexpected_poll"),
    },
    # prefill's KV manager: the bootstrap thread and the transfer workers
    "prefill.bootstrap_thread": {None: ("p_recv_metadata", "p_recv_abort")},
    "prefill.transfer_worker": {None: ("xfer_dequeue", "xfer_write", "xfer_fail",
                                       "xfer_stray_lands", "xfer_session_failed",
                                       "xfer_worker_raises")},
    # with SGLANG_ENABLE_FAILED_SESSION_PROBE, each prefill rank's manager
    # runs a probe thread (mc 19:273-285 ... 23:374-377)
    "prefill.probe_thread": {None: ("p_probe_failed_sessions",)},
    "decode.scheduler": {
        # pause_generation and the waiting-queue timeout's aborts come in
        # with the requests (sch 21:2063-2075)
        "ingest": ("d_intake", "d_abort", "d_pause_retract", "d_req_waiting_timeout"),
        "release": ("d_deferred_timeout",),
        "resume": ("d_resume",),
        # every decode rank's loop at once, where their own pools decide apart
        # (pop_preallocated resolves the pending receivers first)
        "prealloc": ("d_prealloc_drop", "d_unexpected_poll", "d_prealloc", "d_prealloc_splits",
                     "d_handshake", "d_fetch_prefill_info", "d_fetch_fails"),
        # the receiver's poll() notices its waiting timeout (mc 21:3031-3039)
        "transfer": ("d_transferred", "d_transfer_poll", "d_poll_popped_room",
                     "d_waiting_timeout"),
        "batch": ("d_attend", "d_retract"),
        "result": ("d_respond",),
        # the door: at ingest for a new or rebootstrapped request, in
        # retract_decode's own call (batch) for a retracted one
        None: ("d_door",)},
    # decode's KV manager: decode_thread
    "decode.decode_thread": {None: ("d_recv_status", "d_drop_late_status", "d_recv_ack")},
    # ... and its heartbeat checker thread (cc 19:1083 ... 23:1998)
    "decode.heartbeat_thread": {None: ("d_node_failure", "d_heartbeat_lost")},
    # the prefill instance as a whole: its death stops every prefill process
    "prefill.instance": {None: ("p_dies",)},
}
# the transfer worker's steps that are the NIC's, not its thread's: a write
# the worker gave up on lands whenever it lands, whether or not the thread
# still runs
NIC_STEPS = ("xfer_stray_lands",)

_PROCESS: Dict[str, Tuple[str, Optional[str]]] = {
    a: (proc, phase) for proc, by_phase in _STEPS.items()
    for phase, names in by_phase.items() for a in names}

_PHASE_OF_STAGE = {PStage.BOOTSTRAP: "bootstrap", PStage.WAITING: "batch",
                   PStage.CHUNKED: "batch", PStage.INFLIGHT: "inflight"}
_LOOP = {loop.name: loop for loop in LOOPS}


def process_of(action: str) -> str:
    """The process whose step ``action`` is (KeyError for an unknown one)."""
    return _PROCESS[action][0]


def loop_of(action: str) -> Optional[Loop]:
    """The scheduler loop whose step ``action`` is (None: a thread's step)."""
    return _LOOP.get(_PROCESS[action][0])


def phase_of(action: str, s: State, r: int) -> Optional[str]:
    """The phase of its loop in which ``action`` is taken on request ``r`` in
    state ``s`` (None: not a step of a scheduler loop)."""
    proc, phase = _PROCESS[action]
    if proc not in _LOOP or phase is not None:
        return phase
    if proc == PREFILL_LOOP.name:
        return _PHASE_OF_STAGE.get(s.p[r].stage)
    return "batch" if s.d[r].door_flag == "retracted" else "ingest"


def actions_of_phase(phase: str, loop: Loop = PREFILL_LOOP) -> Tuple[str, ...]:
    """The actions that can be a step of ``loop``'s ``phase``."""
    stage_phased = phase in _PHASE_OF_STAGE.values() if loop is PREFILL_LOOP else (
        phase in ("ingest", "batch"))
    return tuple(a for a, (proc, ph) in _PROCESS.items()
                 if proc == loop.name and (ph == phase or (ph is None and stage_phased)))


_last: List[object] = [None, frozenset(), None]


def skipped_phases(loop: Loop, s: State) -> FrozenSet[str]:
    """The phases ``loop`` skips in state ``s`` (``Loop.returns_early``); the
    last state's answer is kept, since the registry asks once per action."""
    if _last[0] is s and _last[2] is loop:
        return _last[1]  # type: ignore[return-value]
    out = frozenset(ph for cond, phases in loop.returns_early if CONDITIONS[cond](s)
                    for ph in phases)
    _last[:] = [s, out, loop]
    return out


def loop_gate(action: str) -> Optional[Tuple[Loop, str]]:
    """(loop, phase) when ``action`` is a step of a loop phase that the loop
    can skip (its guard is gated on :func:`skipped_phases`), else None."""
    proc, phase = _PROCESS.get(action, (None, None))
    loop = _LOOP.get(proc)
    if loop is None or phase is None:
        return None
    if not any(phase in phases for _, phases in loop.returns_early):
        return None
    return loop, phase


def known() -> Tuple[str, ...]:
    return tuple(_PROCESS)
