"""The action vocabulary: the context, the ``@action`` registry, steps, and
the next-state relation as the disjunction of the registered actions
(``successors``), with ``apply`` to re-execute one recorded step."""
from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

import attrs

from reqmodel.model import clocks, processes
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.events import Event
from reqmodel.model.state import (DRAFTING, client_abort, DecodeReq, DRoom, DStage, Finish,
                                  MetaSlot, MsgKind, Page, PrefillReq, PStage, replace, Room,
                                  State)


@attrs.frozen
class Ctx:
    release: Release
    scenario: Scenario
    # (action, request) pairs whose scenario event flag is on, in registry
    # order: filled on first use (``candidates``), after every action has
    # registered; the guards are evaluated only on these
    _candidates: Optional[Tuple[Tuple["Action", int], ...]] = attrs.field(
        default=None, init=False, eq=False, repr=False)

    @property
    def candidates(self) -> Tuple[Tuple["Action", int], ...]:
        got = self._candidates
        if got is None:
            got = tuple((a, r) for a in ACTIONS if a.on(self.release)
                        for r in range(self.scenario.n) if a.allowed(self.scenario, r))
            object.__setattr__(self, "_candidates", got)
        return got

    # candidates by what their guards need (``Needs``), keyed by the
    # requests' stages and their messages in flight: filled as states come
    # (a few thousand keys on the largest built-in scenarios)
    _by_needs: Dict[Tuple, Tuple[Tuple["Action", int], ...]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False)
    _outlasts: Optional[bool] = attrs.field(default=None, init=False, eq=False, repr=False)

    def indexed(self, s: State) -> Tuple[Tuple["Action", int], ...]:
        """The candidates whose ``Needs`` hold in ``s``, in registry order:
        the only ones whose guard can hold (``enabled``)."""
        key = (tuple([q.stage for q in s.p]), tuple([q.stage for q in s.d]), in_flight(s))
        got = self._by_needs.get(key)
        if got is None:
            got = self._by_needs[key] = tuple(
                (a, r) for a, r in self.candidates
                if a.needs is None or a.needs.met(key[0][r], key[1][r], key[2], r))
        return got

    @property
    def deferred(self) -> bool:
        d = self.scenario.deferred_release
        return self.release.deferred_release_default if d is None else d

    @property
    def failed_session_probe(self) -> bool:
        """Prefill's KV managers run the failed-session probe thread."""
        d = self.scenario.failed_session_probe
        return self.release.failed_session_probe_default if d is None else d

    def timeout_seconds(self, a: "Action") -> float:
        """The seconds of timeout action ``a`` in the scenario's deployment
        (its ``options.timeouts``, else the release's default)."""
        return clocks.seconds(self.release, self.scenario, a.timeout)

    @property
    def hold_outlasts_writes(self) -> bool:
        """``clocks.hold_outlasts_writes`` for this release and scenario."""
        got = self._outlasts
        if got is None:
            got = clocks.hold_outlasts_writes(self.release, self.scenario)
            object.__setattr__(self, "_outlasts", got)
        return got

    @property
    def abort_status(self) -> Finish:
        return client_abort(self.release.client_abort_status)


Effect = Tuple[State, Tuple[Event, ...]]


@attrs.frozen
class Needs:
    """What an action's guard requires of request ``r`` before anything else,
    as data: its prefill stage is one of ``p``, its decode stage one of
    ``d``, a message of its own of one of the kinds ``msgs`` is in flight
    (each left empty: no requirement).  The guard still tests all of it
    itself; the declaration lets the engines skip guards that cannot hold
    (``Ctx.indexed``), indexed by the requests' stages and messages.
    ``tests/test_fast_paths.py`` checks, on every reachable state of the
    built-in scenarios on every release (the four largest on one), that no
    guard holds without its needs."""

    p: FrozenSet[PStage] = attrs.field(default=frozenset(), converter=frozenset)
    d: FrozenSet[DStage] = attrs.field(default=frozenset(), converter=frozenset)
    msgs: FrozenSet[MsgKind] = attrs.field(default=frozenset(), converter=frozenset)

    def met(self, p: PStage, d: DStage, net: FrozenSet[Tuple[MsgKind, int]], r: int) -> bool:
        return ((not self.p or p in self.p) and (not self.d or d in self.d)
                and (not self.msgs or any((k, r) in net for k in self.msgs)))

    def holds(self, s: State, r: int) -> bool:
        return self.met(s.p[r].stage, s.d[r].stage, in_flight(s), r)


def in_flight(s: State) -> FrozenSet[Tuple[MsgKind, int]]:
    """The (kind, request) of every message in flight, as ``Needs`` reads them."""
    return frozenset([(m.kind, m.rid) for m in s.net])


@attrs.frozen
class Action:
    name: str
    actor: str  # client | prefill | decode | transfer
    guard: Callable[[Ctx, State, int], bool]
    effect: Callable
    choices: Optional[Callable[[Ctx, State, int], Iterable[Tuple]]] = None
    event_flag: Optional[str] = None  # scenario.events flag that enables it
    arg_names: Tuple[str, ...] = ()  # names of the choice's components, for traces
    # how many trailing components a step may leave out (a one-rank scenario
    # names no decode rank; a metadata slot is named only when it is a choice)
    optional_args: int = 0
    # the worker whose process runs the step: "prefill" (its scheduler, or its
    # transfer worker and KV manager) or "decode"
    worker: str = "prefill"
    # a timeout: the environment variable that sets it (its default seconds
    # per release are the release record's ``timeouts``)
    timeout: Optional[str] = None
    # the conformance seam that drives this step on the real code (conform.adapter.SEAMS)
    seam: Optional[str] = None
    # a step the environment chooses, not the deployment's own progress: a
    # client abort, a transfer failure, a retraction or pause, every timeout
    # (by default: the steps a scenario [events] flag switches on); the
    # liveness properties ask for answers through the other steps
    environment: bool = False
    # an environment step that, once ``follows(ctx, s, rid)`` holds, is the
    # deployment's own consequence of one already taken (the client's abort
    # reaching the second worker)
    follows: Optional[Callable[[Ctx, State, int], bool]] = None
    # a step whose only effect is a scheduler raising out of its loop (the
    # run ends there, ``State.crashed``); a sampling engine may keep it for
    # last when the property it looks for is not about crashes
    crash: bool = False
    # what the guard requires first, as data the engines index (``Needs``)
    needs: Optional[Needs] = None
    # the releases whose code has the step at all, from their records (None:
    # every release); elsewhere it is no candidate and no sampling rule
    releases: Optional[Callable[[Any], bool]] = None
    # the scenarios that can have the step at all (None: every one): a step
    # that follows from an event, not an event itself (decode's heartbeat
    # declaring a dead prefill lost); elsewhere it is no candidate and in no
    # sampling schedule, as for a release without it
    scenarios: Optional[Callable[[Scenario], bool]] = None
    # a timeout: when its clock runs, in words ("while ..."), for a
    # counterexample that says why no timeout ends a wait
    armed: str = ""

    def on(self, release) -> bool:
        """The step exists in ``release``'s code."""
        return self.releases is None or self.releases(release)

    @property
    def doc(self) -> str:
        return (self.effect.__doc__ or "").strip()

    def own(self, ctx: Ctx, s: State, rid: int) -> bool:
        """Taken in ``s`` on request ``rid``: a step of the deployment's own
        progress, not one the environment chooses."""
        return not self.environment or (self.follows is not None and self.follows(ctx, s, rid))

    def allowed(self, sc: Scenario, rid: int) -> bool:
        """The scenario lets this action happen to request ``rid`` at all (its
        ``[events]`` flag, if it has one, is on for the request)."""
        return ((not self.event_flag or sc.events.on(self.event_flag, rid))
                and (self.scenarios is None or self.scenarios(sc)))

    def enabled(self, ctx: Ctx, s: State, rid: int) -> bool:
        """Allowed, not after a crash (``State.crashed``: a dead scheduler
        takes its server down, so nothing moves on), and the guard holds."""
        return self.allowed(ctx.scenario, rid) and not s.halted() and self.guard(ctx, s, rid)

    def args(self, ctx: Ctx, s: State, rid: int) -> Iterable[Tuple]:
        return self.choices(ctx, s, rid) if self.choices else ((),)


class SchedulerDied(Exception):
    """Raised inside an effect where the code raises out of a scheduler's
    loop part-way through a step: the step ends there, with the state and
    events up to the raise (the state marks the crash, ``State.crashed``)."""

    def __init__(self, state: State, events: Tuple[Event, ...]):
        super().__init__(events)
        self.state, self.events = state, events


RANK_ARG = ("rank",)  # the choice of actions that name a decode rank
PRANK_ARG = ("prefill_rank",)  # ... that name a prefill rank (its transfer worker)
CHANNEL_ARG = ("rank", "prefill_rank")  # ... that name a decode-prefill rank pair
ACTIONS: List[Action] = []
BY_NAME: Dict[str, Action] = {}
# history variables kept across every step, ``note(ctx, before, after,
# events) -> after``: what a later guard must know of the order of earlier
# steps, and no step of the code sets (``intake.note_client_waits``)
HISTORY: List[Callable[[Ctx, State, State, Tuple[Event, ...]], State]] = []


def _loop_gated(name: str, guard: Callable) -> Callable:
    """``guard``, and the step's loop phase is not one its loop skips in the
    state (``processes.Loop.returns_early``: decode's loop skips every phase
    after ingest while its engine is paused, and both scans while a request
    waits retracted).  One place for every action of those phases, so a new
    one cannot forget the loop's return; ``why_not`` names the condition."""
    gate = processes.loop_gate(name)
    if gate is None:
        return guard
    loop, phase = gate

    def gated(ctx, s, rid):
        return phase not in processes.skipped_phases(loop, s) and guard(ctx, s, rid)

    gated.__name__ = getattr(guard, "__name__", name)
    gated.loop_phase = gate  # type: ignore[attr-defined]
    return gated


def _alive_gated(name: str, guard: Callable) -> Callable:
    """``guard``, and, for a step of one of prefill's processes (its
    scheduler loop, its KV manager's threads), the prefill instance serving
    the request has not died (``State.prefill_down``): a dead process takes
    no step.  One place for every such action, so a new one cannot forget
    it; ``why_not`` names it."""
    if not processes.process_of(name).startswith("prefill."):
        return guard

    def gated(ctx, s, rid):
        return not (s.prefill_dead and s.prefill_down(rid)) and guard(ctx, s, rid)

    gated.__name__ = getattr(guard, "__name__", name)
    gated.alive_gate = True  # type: ignore[attr-defined]
    for k, v in vars(guard).items():  # the loop gate's mark, if any
        setattr(gated, k, v)
    return gated


def action(actor: str, guard: Callable, choices: Callable = None, event: str = None,
           arg_names: Tuple[str, ...] = (), optional_args: int = 0, worker: str = None,
           timeout: str = None, seam: str = None, environment: bool = None,
           follows: Callable = None, crash: bool = False, needs: Needs = None,
           releases: Callable = None, scenarios: Callable = None, armed: str = ""):
    """Register an action: ``guard(ctx, s, rid) -> bool`` first, effect below.

    ``worker`` defaults to the actor for the schedulers' actions and to
    prefill for the transfer worker's; a client action names the worker whose
    scheduler handles it."""
    if worker is None:
        if actor == "client":
            raise ValueError("a client action names its worker")
        worker = "prefill" if actor == "transfer" else actor
    assert worker in ("prefill", "decode"), worker

    def deco(fn):
        names = tuple(arg_names)

        @functools.wraps(fn)
        def effect(ctx, s, rid, arg=()):
            was = DRAFTING.begin()  # one new State per step (state._Drafting)
            try:
                nxt, evs = fn(ctx, s, rid, arg)
            except SchedulerDied as died:  # the rest of the step never runs
                nxt, evs = died.state, died.events
            finally:
                DRAFTING.end(was)
            for note in HISTORY:
                nxt = note(ctx, s, nxt, evs)
            return nxt, evs

        a = Action(fn.__name__, actor,
                   _alive_gated(fn.__name__, _loop_gated(fn.__name__, guard)), effect, choices,
                   event, names,
                   len(names) if names in (RANK_ARG, PRANK_ARG, CHANNEL_ARG) else optional_args,
                   worker, timeout, seam, event is not None if environment is None else environment,
                   follows, crash, needs, releases, scenarios, armed)
        assert bool(timeout) == bool(armed), f"{fn.__name__}: a timeout says when it is armed"
        ACTIONS.append(a)
        BY_NAME[a.name] = a
        return fn
    return deco


def set_p(s: State, r: int, **kw) -> State:
    return replace(s, p=s.p[:r] + (replace(s.p[r], **kw),) + s.p[r + 1:])


def set_d(s: State, r: int, **kw) -> State:
    return replace(s, d=s.d[:r] + (replace(s.d[r], **kw),) + s.d[r + 1:])


def pranks(c: Ctx) -> range:
    """The prefill ranks: one KV manager, transfer worker and page slice each."""
    return range(c.scenario.prefill.ranks)


def initial_state(sc: Scenario) -> State:
    n = sc.n
    return State(
        p=tuple(PrefillReq() for _ in range(n)),
        d=tuple(DecodeReq() for _ in range(n)),
        # keyed by (room slot, prefill rank)
        rooms=tuple(Room() for _ in range(n * sc.prefill.ranks)),
        d_rooms=tuple(DRoom() for _ in range(n)),
        room_slots=tuple(sc.room_slot(r) for r in range(n)) if sc.shares_rooms else (),
        d_pages=tuple(Page(slice_writers=(None,) * (sc.prefill.ranks - 1))
                      for _ in range(sc.decode.pool_pages)),
        d_slots=tuple(MetaSlot() for _ in range(sc.decode.metadata_buffers)),
        aborted_by_client=tuple(False for _ in range(n)),
    )


@attrs.frozen(order=True)
class Step:
    """A transition label: action name, request, choice."""

    action: str
    rid: int
    arg: Tuple = ()

    def __str__(self) -> str:
        a = BY_NAME.get(self.action)
        names = a.arg_names if a is not None else ()
        parts = [f"r{self.rid}"]
        for i, v in enumerate(self.arg):
            name = names[i] if i < len(names) else f"arg{i}"
            parts.append(f"{name}={list(v) if isinstance(v, tuple) else v}")
        return f"{self.action}({', '.join(parts)})"


def successors(ctx: Ctx, s: State, max_choices: Optional[int] = None
               ) -> Iterable[Tuple[Step, State, Tuple[Event, ...]]]:
    """Every enabled step of ``s``: the next-state relation is the disjunction
    of the actions, over requests and choices (with ``max_choices``, only the
    first that many choices of each action: a bounded sample)."""
    for a, r in enabled(ctx, s):
        for arg in itertools.islice(a.args(ctx, s, r), max_choices):
            nxt, evs = a.effect(ctx, s, r, arg)
            yield Step(a.name, r, arg), nxt, evs


def enabled(ctx: Ctx, s: State) -> Iterable[Tuple[Action, int]]:
    """Every (action, request) whose guard holds in ``s``, in registry order;
    none after a crash or once decode's ranks diverged (``State.halted``, as
    ``Action.enabled``)."""
    if s.halted():
        return
    # the event flags are checked once per context, the guards' needs once
    # per stages and messages in flight (``Needs``)
    for a, r in ctx.indexed(s):
        if a.guard(ctx, s, r):
            yield a, r


def armed_timeouts(ctx: Ctx, s: State) -> Iterable[Tuple[Action, int]]:
    """Every timeout (action, request) whose guard holds in ``s``: armed in
    the deployment, whether or not the scenario lets it fire (its
    ``[events] timeouts`` flag); none after a crash or once the ranks
    diverged (nothing moves then)."""
    if s.halted():
        return
    for a in ACTIONS:
        if a.timeout is not None:
            for r in range(len(s.p)):
                if a.guard(ctx, s, r):
                    yield a, r


def timeout_armed(ctx: Ctx, s: State) -> bool:
    """Some timeout is armed in ``s`` (:func:`armed_timeouts`)."""
    return any(True for _ in armed_timeouts(ctx, s))


def why_not(ctx: Ctx, s: State, step: Step) -> str:
    """Why ``step`` cannot be taken in ``s``, in words (what :func:`apply`
    checks, in its order); empty when it can."""
    a = BY_NAME.get(step.action)
    if a is None:
        return f"there is no action {step.action!r} in the model"
    r = step.rid
    if not 0 <= r < ctx.scenario.n:
        return f"request {r} is not in the scenario ({ctx.scenario.n} requests)"
    if not a.allowed(ctx.scenario, r):
        if a.event_flag and not ctx.scenario.events.on(a.event_flag, r):
            return f"the scenario's [events] {a.event_flag} is off for request {r}"
        return "the scenario cannot have this step (no event it follows from is on)"
    if s.crashed():
        return "a scheduler crashed at an earlier step, and nothing moves after a crash"
    if s.halted():
        return ("decode's ranks diverged at an earlier step, and the model does not follow "
                "them past it")
    if getattr(a.guard, "alive_gate", False) and s.prefill_down(r):
        return (f"the prefill instance serving request {r} has died: its "
                f"{processes.process_of(a.name)} takes no step")
    if (s.workers_dead and processes.process_of(a.name) == "prefill.transfer_worker"
            and a.name not in processes.NIC_STEPS):
        from reqmodel.model.actions.transfer import worker_dead
        from reqmodel.model.actions.transport import prank_of
        q = prank_of(step.arg)
        if worker_dead(ctx, s, r, q):
            return (f"the transfer worker that takes request {r}'s chunks on prefill rank {q} "
                    "raised at an earlier step: its thread takes no step")
    gate = getattr(a.guard, "loop_phase", None)
    if gate is not None and gate[1] in processes.skipped_phases(gate[0], s):
        loop, phase = gate
        held = [c for c, phases in loop.returns_early
                if phase in phases and processes.CONDITIONS[c](s)]
        return (f"the {loop.name} loop skips its {phase} phase while "
                f"{' and '.join(processes.WHILE[c] for c in held)}")
    if not a.guard(ctx, s, r):
        name = getattr(a.guard, "__name__", "its guard").lstrip("_")
        return (f"its guard {name} does not hold for request {r} (prefill "
                f"{s.p[r].stage.name}, decode {s.d[r].stage.name})")
    if a.choices is not None:
        now = [tuple(x) for x in a.args(ctx, s, r)]
        if tuple(step.arg) not in now:
            shown = ", ".join(str(x) for x in now[:5]) + (" ..." if len(now) > 5 else "")
            names = ", ".join(a.arg_names) or "choice"
            return (f"its {names} {tuple(step.arg)} is not one it can take now "
                    f"({shown or 'none'})")
    return ""


def apply(ctx: Ctx, s: State, step: Step) -> Optional[Tuple[State, Tuple[Event, ...]]]:
    """Re-execute one recorded step, or None when its guard is not enabled."""
    a = BY_NAME.get(step.action)
    if a is None or not 0 <= step.rid < ctx.scenario.n or not a.enabled(ctx, s, step.rid):
        return None
    if a.choices is not None and tuple(step.arg) not in {tuple(x) for x in a.args(ctx, s, step.rid)}:
        return None
    return a.effect(ctx, s, step.rid, tuple(step.arg))
