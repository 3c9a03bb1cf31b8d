"""The Hypothesis engine: a stateful test generated from the model.

``machine(release, scenario, props)`` builds a ``RuleBasedStateMachine`` whose
rules are the model's actions (``reqmodel.actions.ACTIONS``), one rule per
action: its precondition is "the guard is enabled for some request", and the
rule draws the request and the choice among the enabled ones. State
properties become ``@invariant``s, transition properties are checked after
each rule, and a reachability property is searched for as the failure of
"the good state never happens". Nothing of the protocol is written here:
adding an action to the model adds a rule.

One more rule, ``start``, begins a *run* of the scenario: it draws the run's
schedule (when each scenario event is due, which threads and actions wait;
see ``enabled_map``), and fires again whenever the run can no longer move,
so a test case of ``stateful_step_count`` steps holds several runs.

A failing example is shrunk by Hypothesis (``thorough`` only), then
minimised over replay (``minimise``): delta debugging removes steps while the
property still breaks (a step the model no longer enables is skipped), and a
bounded breadth-first tail search replaces the end of the trace by a shorter
one where the violation has a shorter ending than the one found. Lengths are
compared with the exhaustive engine's shortest in ``notes/performance.md``.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import os
import random
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import attrs
from hypothesis import HealthCheck, Phase, settings, target
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import InvalidDefinition
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition,
                                 rule, run_state_machine_as_test)

from reqmodel.engines.hypothesis import shim
from reqmodel.model.actions import ACTIONS, BY_NAME, PRANK_ARG, Ctx, Step, apply, initial_state, successors
from reqmodel.engines.exhaustive import Trace, Verdict, replay, symmetry_classes
from reqmodel.engines.symmetry import canonical, ReprKey
from reqmodel.model import events as ev
from reqmodel.model.properties import Property
from reqmodel.model.releases import Release
from reqmodel.model.scenario import (EVENT_NAMES, MAX_DECODE_RANKS, MAX_PREFILL_RANKS, MAX_REQUESTS, Events,
                       Scenario, Worker)
from reqmodel.model.properties import Kind

# --------------------------------------------------------------- profiles

DB_PATH = os.path.join(".hypothesis", "reqmodel")
# choices sampled per allocation (page selections grow factorially with the
# number of distinct free pages in drawn scenarios; the exhaustive engine
# enumerates all of them)
MAX_CHOICES = 256
# an event's timer counts its request's steps on the event's worker, drawn in
# [0, EVENT_HORIZON + 1] (past the horizon: only when nothing else can move);
# a request's life on one worker takes 5 to 10 steps in the built-in scenarios
EVENT_HORIZON = 10
REARM = 0.5  # chance that an event, once fired, is armed again (start, fire)
WORKERS = ("P", "D")
WORKER = {a.name: "D" if a.worker == "decode" else "P" for a in ACTIONS}
THREADS = ("P", "D", "X")  # a request's prefill side, decode side, KV transfer
THREAD = {a.name: "X" if a.actor == "transfer" else WORKER[a.name] for a in ACTIONS}
EVENT_ACTIONS = frozenset(a.name for a in ACTIONS if a.event_flag is not None)
CRASH_ACTIONS = frozenset(a.name for a in ACTIONS if a.crash)
_COMMON = dict(deadline=None, stateful_step_count=80,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                      HealthCheck.data_too_large])
# dev and ci leave shrinking to ``minimise`` (delta debugging over replay):
# Hypothesis's own shrinker reaches the same lengths on long stateful programs
# but takes minutes (notes/performance.md); thorough keeps it.
# They also leave out the targeting phase: it hill-climbs on one example
# (the scores in ``teardown``) and, measured on auto-truncate 0.5.23, re-ran
# one schedule 224 times out of 976 runs and missed a cell found without it.
_NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
PROFILES = {
    "dev": dict(max_examples=100, phases=_NO_SHRINK, **_COMMON),
    "ci": dict(max_examples=400, derandomize=True, phases=_NO_SHRINK, **_COMMON),
    "thorough": dict(max_examples=5000, **_COMMON),
}


def profile_settings(name: str, database: bool = True) -> settings:
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r} (known: {', '.join(PROFILES)})")
    kw = dict(PROFILES[name])
    if database and not kw.get("derandomize"):
        kw["database"] = DirectoryBasedExampleDatabase(DB_PATH)
    else:
        kw["database"] = None
    return settings(**kw)


def register_profiles() -> None:
    """Make the profiles available to pytest's ``--hypothesis-profile``."""
    for name in PROFILES:
        settings.register_profile(name, profile_settings(name))


def run(M: type, settings_: settings) -> None:
    """``run_state_machine_as_test`` with Hypothesis's constant injection off.

    Hypothesis (6.1xx) mixes into its draws the literals it finds in the
    project's modules *loaded so far* (``providers._get_local_constants``),
    so a derandomized run depends on what else the process imported first:
    measured, `pause-abort` on 0.5.19 is found after 59 test cases alone and
    not in 451 once every reqmodel module is loaded. With the injection off
    a ``ci`` run gives the same result in any test order."""
    with shim.no_constant_injection():
        run_state_machine_as_test(M, settings=settings_)


# --------------------------------------------------------------- machine


@functools.lru_cache(maxsize=None)
def index(n: int) -> st.SearchStrategy:
    """Pick one of n (built once per n: building a strategy per step costs
    more than the model's step)."""
    return st.integers(0, n - 1)


class Violation(AssertionError):
    """A property broke; carries the steps that broke it."""

    def __init__(self, prop: str, steps: Tuple[Step, ...], scenario: Optional[Scenario] = None):
        super().__init__(f"{prop} violated after {len(steps)} steps")
        self.prop = prop
        self.steps = steps
        self.scenario = scenario


@attrs.define
class Stats:
    examples: int = 0
    runs: int = 0
    steps: int = 0


def late_actions(props: Sequence[Property]) -> frozenset:
    """The actions a run holds back until nothing else can move: a crash ends
    a run, so unless one of ``props`` looks for a crash, a crash step waits
    and the run goes on to what it looks for.  Besides the scenario and the
    rules, the only thing of the properties a machine's draws depend on (its
    checks draw nothing): machines whose properties agree on this draw the
    same runs."""
    if any(p.kind == Kind.ALWAYS and p.transition
           and ev.Crash in getattr(p.transition, "events", ()) for p in props):
        return frozenset()
    return CRASH_ACTIONS


def machine(release: Release, scenario, props: Sequence[Property],
            stats: Optional[Stats] = None) -> type:
    """``scenario`` is a Scenario, or a strategy of scenarios: then each run
    first draws its scenario (``scenarios()`` draws beyond the exhaustive
    bounds)."""
    fixed = isinstance(scenario, Scenario)
    stats = stats if stats is not None else Stats()
    trans = [p for p in props if p.kind == Kind.ALWAYS and p.transition]
    states = [p for p in props if p.kind == Kind.ALWAYS and p.state]
    reach = [p for p in props if p.kind == Kind.SOMETIMES]
    late = late_actions(props)

    # one context per scenario across the machine's runs and examples: its
    # caches (the candidates, the guards' index by needs) then fill once,
    # where a context per run rebuilt them every run (a fifth of a run on
    # ``incident``)
    @functools.lru_cache(maxsize=256)
    def context(sc: Scenario) -> Ctx:
        return Ctx(release=release, scenario=sc)

    def setup(self, sc: Scenario) -> None:
        self.scenario = sc
        self.ctx = context(sc)
        self.n = sc.n
        self.state = initial_state(sc)
        self.steps = []
        self._progress = {(w, r): 0 for w in WORKERS for r in range(sc.n)}
        self._fired_for = {}  # action -> requests it has fired for in this run
        self._enabled_for = None

    def __init__(self):
        RuleBasedStateMachine.__init__(self)
        shim.install_rule_strategy(self, EnabledRules(self))
        self.state = None
        self.steps: List[Step] = []
        self._history: List[str] = []  # every step of this example, across runs
        self._enabled_for = None
        self._enabled: Dict[str, List[int]] = {}
        self._stale = 0
        self._answered = 0
        self._delayed = {}
        self._rank = None
        self._timers = {}
        self._rnd = None
        stats.examples += 1

    ns = {"__init__": __init__}

    def enabled_map(self) -> Dict[str, List[int]]:
        """action -> requests it may fire for now, computed once per state.

        Three tiers, drawn per run (``start``), and two kinds of run:
        * an event whose timer has run out is *due*: due events fire before
          anything else, at the first step where their guard allows, so an
          interrupt lands at a precise point of its request's life;
        * delayed (action, request) pairs wait until their release step (or,
          with no release step, until nothing else can move): a progress-
          preserving swarm over pairs, so one request can be held back while
          another goes all the way through (the incident's shape);
        * everything else is uniform in a *delay run*; in a *priority run*
          only the enabled (action, request) pair ranked first moves, a
          random total order over the pairs drawn for the run (it holds back
          a whole chain of one request's steps behind another's, which
          delays released at a step rarely line up; notes/performance.md).
        When nothing in the first two tiers can move, anything enabled may,
        early events included: a run ends only where the model is stuck."""
        if self.state is None:
            return {}
        key = (id(self.state), len(self.steps))
        if self._enabled_for != key:
            ctx, t = self.ctx, len(self.steps)
            # the actions that can fire, each with its requests; an action
            # that cannot is left out (not given an empty list)
            full: Dict[str, List[int]] = {}
            timers, state = self._timers, self.state
            # nothing moves after a crash (Action.enabled)
            # event flags checked, and the guards' needs (Ctx.indexed)
            for a, r in (() if state.halted() else ctx.indexed(state)):
                if (a.event_flag is None or (a.name, r) in timers) and a.guard(ctx, state, r):
                    full.setdefault(a.name, []).append(r)
            due = {}
            for k, v in full.items():
                if k in EVENT_ACTIONS:
                    got = [r for r in v if self._due(k, r)]
                    if got:
                        due[k] = got
            if due:
                self._enabled = due
            else:
                now = {}
                for k, v in full.items():
                    if k not in EVENT_ACTIONS and k not in late:
                        got = [r for r in v if not self._held(k, r, t)]
                        if got:
                            now[k] = got
                if self._rank is not None and now:
                    k, r = min(((k, r) for k, v in now.items() for r in v), key=self._rank.get)
                    now = {k: [r]}
                self._enabled = now or full
            self._enabled_for = key
        return self._enabled

    ns["enabled_map"] = enabled_map

    def _held(self, name, r, t) -> bool:
        """A delayed pair is held until its release step (None: until nothing
        else can move; OVERTAKEN: until the action has fired for another
        request)."""
        for key in ((name, r), (THREAD[name], r)):
            release_at = self._delayed.get(key, -1)
            if release_at is OVERTAKEN:
                if not self._fired_for.get(name, set()) - {r}:
                    return True
            elif release_at is None or t < release_at:
                return True
        return False

    ns["_held"] = _held

    def _due(self, name, r) -> bool:
        """An event's timer counts its request's own steps (its progress
        through the lifecycle, whatever the other requests do)."""
        at = self._timers.get((name, r))
        return at is not None and self._progress[(WORKER[name], r)] >= at

    ns["_due"] = _due

    def quiescent(self):
        return self.state is not None and not self.enabled_map()

    def enabled_rules(self):
        """The names of the rules whose precondition holds, from one
        ``enabled_map`` (what the preconditions below say, one rule at a time;
        ``tests/test_hypo.py`` checks that they agree)."""
        if self.state is None or quiescent(self):
            return {"start"}
        return set(self.enabled_map())

    ns["enabled_rules"] = enabled_rules

    def start(self, data):
        """Start a run: draw its scenario (unless fixed), then when each
        scenario event is due (a timer past EVENT_HORIZON fires only when
        nothing else can move; interrupts such as client aborts would
        otherwise fire at almost every step), and which threads (a request's
        prefill, decode or transfer side) and (action, request) pairs wait.
        The schedule comes from one drawn seed (``draw_schedule``):
        Hypothesis's own draws favour boundary values (a timer of 0 came out
        in 40 % of runs, a priority run in 32 %), which starves the mid-life
        interrupts and orderings the search is for; shrinking does not need
        the schedule, since ``minimise`` works on the steps.
        A run that can no longer move starts over, so one Hypothesis example
        holds several runs (``stateful_step_count`` steps in all): a run takes
        10 to 30 steps, and the rest of the example would be idle."""
        setup(self, scenario if fixed else data.draw(scenario, label="scenario"))
        seed = data.draw(st.integers(0, 2 ** 64 - 1), label="run seed")
        # salted with the example's history: Hypothesis draws the simplest
        # value (0) for a good share of seeds, which would repeat one schedule
        # across runs and examples; the history is a function of the
        # example's choices, so a replay gets the same schedule
        salt = ";".join(self._history)
        self._rnd = random.Random(f"{seed}|{salt}")
        self._timers, self._rank, self._delayed = draw_schedule(self._rnd, self.scenario,
                                                                self.ctx.release)
        stats.runs += 1

    ns["start"] = precondition(lambda self: self.state is None or quiescent(self))(
        rule(data=st.data())(start))

    def make_rule(a):
        def enabled_rids(self):
            return self.enabled_map().get(a.name, [])

        def fire(self, data):
            rids = enabled_rids(self)
            r = rids[data.draw(index(len(rids)), label="rid")]
            arg = ()
            if a.choices is not None:
                options = list(itertools.islice(a.args(self.ctx, self.state, r), MAX_CHOICES))
                # a prefill rank is drawn only when there are several: with
                # one prefill rank the schedules are the ones measured before
                # prefill ranks were modelled (notes/performance.md)
                if a.arg_names == PRANK_ARG and len(options) == 1:
                    arg = options[0]
                else:
                    arg = options[data.draw(index(len(options)), label="arg")]
            pre = self.state
            nxt, evs = a.effect(self.ctx, pre, r, arg)
            step = Step(a.name, r, tuple(arg))
            self.steps.append(step)
            self._history.append(f"{a.name}:{r}:{arg}")
            stats.steps += 1
            self._progress[(WORKER[a.name], r)] += 1
            self._fired_for.setdefault(a.name, set()).add(r)
            if a.event_flag is not None:
                # a timer is due once; half the time the event is armed again
                # for a later step of its request's life, so a run can see it
                # twice where the model allows (a request's transfer failing,
                # then its stale write failing in the room's next lifecycle)
                self._timers.pop((a.name, r), None)
                if self._rnd.random() < REARM:
                    self._timers[(a.name, r)] = (self._progress[(WORKER[a.name], r)]
                                                 + self._rnd.randint(1, EVENT_HORIZON + 1))
            self.state = nxt
            self._stale = max(self._stale, stale_reserved(nxt))
            self._answered = max(self._answered, answered(nxt))
            for p in trans:
                if not p.holds_on(pre, step, evs, nxt):
                    raise Violation(p.name, tuple(self.steps), self.scenario)
        fire.__name__ = fire.__qualname__ = a.name  # before decorating: rules print by name
        return precondition(lambda self: bool(enabled_rids(self)))(rule(data=st.data())(fire))

    for a in ACTIONS:
        if a.on(release):  # a step the release's code does not have is no rule
            ns[a.name] = make_rule(a)

    def teardown(self):
        # targeted phase (thorough only, see _NO_SHRINK): steer towards runs
        # where a reservation holds pages another request wrote (page reuse,
        # the isolation risk) and where more requests get answered (depth);
        # property-agnostic scores
        target(float(self._stale), label="stale pages in a reservation")
        target(float(self._answered), label="answers")

    ns["teardown"] = teardown

    def make_invariant(p, good_is_failure: bool):
        @invariant()
        def check(self):
            if self.state is None:
                return
            ok = p.holds_in(self.state)
            if ok == good_is_failure:  # safety: not ok; reachability: reached
                raise Violation(p.name, tuple(self.steps), self.scenario)
        check.__name__ = f"inv_{p.name.replace('-', '_')}"
        return check

    for p in states:
        ns[f"inv_{p.name.replace('-', '_')}"] = make_invariant(p, False)
    for p in reach:
        ns[f"reach_{p.name.replace('-', '_')}"] = make_invariant(p, True)
    name = scenario.name if fixed else "drawn"
    return type(f"Model_{release.name}_{name}".replace(".", "_").replace("-", "_")
                .replace("+", "_"), (RuleBasedStateMachine,), ns)


class EnabledRules(shim.RuleStrategy):
    """Hypothesis's rule strategy, drawing one rule uniformly among those
    whose precondition holds, as ``RuleStrategy`` does, in one draw.

    ``RuleStrategy`` asks every rule's precondition once to see that some
    rule can run, then again while filtering its draw (and, since 6.16x,
    formats each precondition's description for its observability counters
    on every call): profiled on ``incident`` 0.5.23, 49 precondition calls
    per step and more than half of the run's time.  Here the machine names
    its enabled rules from the one ``enabled_map`` it keeps per state.
    Swarm testing (Hypothesis turning a random subset of rules off per test
    case) is left out: it suits independent API calls but stalls a pipeline
    where every stage is a rule (a run dies at the first disabled stage)."""

    def do_draw(self, data):
        names = self.machine.enabled_rules()
        valid = [r for r in self.rules if r.function.__name__ in names]
        if not valid:
            raise InvalidDefinition(f"no rule of {type(self.machine).__name__} can run")
        chosen = valid[data.draw(index(len(valid)), label="rule")] if len(valid) > 1 else valid[0]
        return chosen, {k: data.draw(v) for k, v in shim.rule_arguments(chosen).items()}


@functools.lru_cache(maxsize=64)
def _run_space(sc: Scenario, release: Optional[Release] = None):
    """The (action, request) pairs, threads and scenario events a schedule
    orders; a step the release's code does not have (``Action.on``) is in no
    schedule of that release, nor one the scenario cannot have
    (``Action.scenarios``)."""
    acts = [a for a in ACTIONS if release is None or a.on(release)]
    pairs = tuple((a.name, r) for a in acts if a.event_flag is None
                  for r in range(sc.n) if a.allowed(sc, r))
    threads = tuple((w, r) for w in THREADS for r in range(sc.n))
    events = tuple((a.name, r) for a in acts if a.event_flag is not None
                   for r in range(sc.n) if a.allowed(sc, r))
    return pairs, threads, events


# a delayed (action, request) pair released once another request has taken
# that step: one request overtakes another at one stage of their lives
OVERTAKEN = "overtaken"


def draw_schedule(rnd: random.Random, sc: Scenario, release: Optional[Release] = None):
    """One run's schedule: ``(timers, rank, delayed)``.

    * timers: for each scenario event, the step of its request's life (on the
      event's worker) from which it is due, uniform in [0, EVENT_HORIZON + 1];
    * half the runs are *priority runs*: ``rank`` orders every (action,
      request) pair and only the first enabled one moves;
    * the others are *delay runs*: some threads wait until a step in
      [0, 40], or (half the time) until nothing else can move; some
      (action, request) pairs wait, a third each, until a step in [0, 40],
      until nothing else can move, or until another request has taken the
      same step (``OVERTAKEN``); ``rank`` is None."""
    pairs, threads, events = _run_space(sc, release)
    timers = {e: rnd.randint(0, EVENT_HORIZON + 1) for e in events}
    if rnd.random() < 0.5:
        order = list(pairs)
        rnd.shuffle(order)
        return timers, {p: i for i, p in enumerate(order)}, {}
    delayed = {}
    for key in rnd.sample(threads, rnd.randint(0, len(threads))):
        delayed[key] = None if rnd.random() < 0.5 else rnd.randint(0, 40)
    for key in rnd.sample(pairs, rnd.randint(0, min(4, len(pairs)))):
        u = rnd.random()
        delayed[key] = None if u < 1 / 3 else OVERTAKEN if u < 2 / 3 else rnd.randint(0, 40)
    return timers, None, delayed


def stale_reserved(s) -> int:
    """Pages reserved by a request whose last writer is another request."""
    return sum(1 for pg in s.d_pages
               if pg.owner is not None and pg.foreign_to(pg.owner))


def answered(s) -> int:
    return sum((p.answer is not None) + (d.answer is not None) for p, d in zip(s.p, s.d))


def rules_of(M: type) -> Dict[str, object]:
    """A generated machine's Hypothesis rules by name (``start`` and one per
    action the release's code has), for driving it outside Hypothesis:
    ``rules_of(M)[name].function``."""
    return {n: getattr(M, n).hypothesis_stateful_rule for n in dir(M)
            if hasattr(getattr(M, n), "hypothesis_stateful_rule")}


class RandomData:
    """Stands in for Hypothesis's ``data`` when a machine is driven outside
    Hypothesis (``benchmarks/run_rates.py``, tests): a uniform index for each
    request and choice, a random run seed."""

    SIZES = {id(index(n)): n for n in range(1, MAX_CHOICES + 1)}

    def __init__(self, rnd: random.Random):
        self.rnd = rnd

    def draw(self, strategy, label=None):
        if label in ("rid", "arg"):
            return self.rnd.randrange(self.SIZES[id(strategy)])
        return self.rnd.getrandbits(64)


# --------------------------------------------------------------- search


def until_hit(ctx: Ctx, prop: Property, steps: Sequence[Step],
              repair: bool = False) -> Optional[Tuple[Step, ...]]:
    """Replay ``steps``, skipping those the model does not enable (or, with
    ``repair``, giving a step whose recorded choice is gone the first choice
    that exists), and return the steps applied up to the one where ``prop``
    is hit (broken, or its good state reached); None if it never is."""
    s = initial_state(ctx.scenario)
    if prop.kind == Kind.SOMETIMES and prop.holds_in(s):
        return ()
    out = []
    for step in steps:
        res = apply(ctx, s, step)
        if res is None and repair:
            step = _repair(ctx, s, step)
            res = None if step is None else apply(ctx, s, step)
        if res is None:
            continue
        out.append(step)
        nxt, evs = res
        if prop.hit(s, step, evs, nxt):
            return tuple(out)
        s = nxt
    return None


def breaks(ctx: Ctx, prop: Property, steps: Sequence[Step]) -> Optional[int]:
    """How many of ``steps`` apply before ``prop`` is hit, or None."""
    hit = until_hit(ctx, prop, steps)
    return None if hit is None else len(hit)


# the tail search looks this many steps deep, within this many states
TAIL_DEPTH = 6
TAIL_BUDGET = 20_000
START_BUDGET = 20_000  # canonical states: two seconds of breadth-first search
START_BUDGET_LARGE = 5_000  # plain states, beyond the exhaustive bounds


def minimise(ctx: Ctx, prop: Property, steps: Sequence[Step],
             deadline: Optional[float] = None) -> Tuple[Step, ...]:
    """A breadth-first search from the initial state first, within
    ``START_BUDGET`` states: when it finds a hit, that is a shortest trace
    (a run can stumble on a long route to a state that a different, shorter
    route also reaches, and deleting steps from the long one cannot find the
    short one).  Otherwise delete steps (``delete_steps``), then replace tails
    by shorter ones (``shorten_tail``), until neither changes the trace.
    Past ``deadline`` (a ``time.monotonic()`` instant; a budgeted search's)
    the searches give up and the trace found so far is returned: shorter
    than the run's, not necessarily shortest."""
    cur = until_hit(ctx, prop, steps, repair=True)
    assert cur is not None, "the steps do not break the property"
    budget = START_BUDGET if _symmetric_search(ctx) else START_BUDGET_LARGE
    shortest = _shortest_hit(ctx, prop, initial_state(ctx.scenario), len(cur) - 1, budget,
                             deadline)
    if shortest is not None:
        return shortest
    while True:
        cur = delete_steps(ctx, prop, cur)
        if deadline is not None and time.monotonic() >= deadline:
            return cur
        shorter = shorten_tail(ctx, prop, cur, deadline=deadline)
        if shorter is None:
            return cur
        cur = shorter


def shorten_tail(ctx: Ctx, prop: Property, steps: Sequence[Step],
                 depth: int = TAIL_DEPTH, budget: int = TAIL_BUDGET,
                 deadline: Optional[float] = None) -> Optional[Tuple[Step, ...]]:
    """A shorter trace that keeps a prefix of ``steps`` and ends differently,
    or None. Deleting steps cannot turn "the decode side answers 200" (three
    steps) into "the prefill side answers 200" (one other step); a
    breadth-first search from the state after each prefix, at most ``depth``
    steps deep and ``budget`` states wide, can. Prefixes are tried from the
    shortest, so the first tail found saves the most steps."""
    states = [initial_state(ctx.scenario)]
    for step in steps[:-1]:
        states.append(apply(ctx, states[-1], step)[0])
    for i in range(max(0, len(steps) - 1 - depth), len(steps)):
        tail = _shortest_hit(ctx, prop, states[i], len(steps) - 1 - i, budget, deadline)
        if tail is not None:
            return tuple(steps[:i]) + tail
    return None


def _symmetric_search(ctx: Ctx) -> bool:
    sc = ctx.scenario
    return (sc.n <= MAX_REQUESTS and sc.decode.ranks <= MAX_DECODE_RANKS
            and sc.prefill.ranks <= MAX_PREFILL_RANKS)


def _shortest_hit(ctx: Ctx, prop: Property, s0, max_len: int,
                  budget: int, deadline: Optional[float] = None) -> Optional[Tuple[Step, ...]]:
    """Breadth-first: the shortest steps from ``s0`` (at most ``max_len``)
    that hit ``prop``; None if there are none or the budget runs out.  States
    are told apart up to symmetry, as in the exhaustive checker (the paths
    stay concrete: each is extended from a real state), within the exhaustive
    checker's bounds; beyond them canonical forms cost more than they save
    (they try every order of tied requests and every rank relabelling).
    None too once ``deadline`` has passed (checked every 256 states)."""
    if _symmetric_search(ctx):
        classes = symmetry_classes(ctx.scenario)
        ranks, pranks = ctx.scenario.decode.ranks, ctx.scenario.prefill.ranks
        order = ReprKey()  # memoised record reprs, shared by the whole search

        def key(x):
            return canonical(x, classes, ranks, pranks, order)
    else:
        def key(x):
            return x
    frontier = [(s0, ())]
    seen = {key(s0)}
    for _ in range(max_len):
        nxt_frontier = []
        for s, path in frontier:
            for step, nxt, evs in successors(ctx, s, MAX_CHOICES):
                if prop.hit(s, step, evs, nxt):
                    return path + (step,)
                k = key(nxt)
                if k not in seen:
                    if len(seen) >= budget:
                        return None
                    if (deadline is not None and not len(seen) % 256
                            and time.monotonic() >= deadline):
                        return None
                    seen.add(k)
                    nxt_frontier.append((nxt, path + (step,)))
        frontier = nxt_frontier
    return None


def delete_steps(ctx: Ctx, prop: Property, cur: Tuple[Step, ...]) -> Tuple[Step, ...]:
    """Delta debugging over replay: drop steps (chunks, then single steps)
    while the property still breaks; cut after the breaking step."""
    chunk = max(1, len(cur) // 2)
    while chunk >= 1:
        i = 0
        changed = False
        while i < len(cur):
            cand = until_hit(ctx, prop, cur[:i] + cur[i + chunk:], repair=True)
            if cand is not None and len(cand) < len(cur):
                cur = cand
                changed = True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return cur


def _repair(ctx: Ctx, s, step: Step) -> Optional[Step]:
    """A step whose recorded choice no longer exists (a deletion changed which
    pages are free) takes the first choice that does, if the action is enabled."""
    a = BY_NAME[step.action]
    if a.choices is None or not a.enabled(ctx, s, step.rid):
        return None
    first = next(iter(a.args(ctx, s, step.rid)), None)
    return Step(step.action, step.rid, tuple(first)) if first is not None else None


@attrs.frozen
class HypoVerdict:
    verdict: Verdict
    examples: int
    steps: int
    shrunk_length: Optional[int]  # the failing run's length, before minimise
    seconds: float
    runs: int = 0
    cut: bool = False  # the time budget ended the search before the profile's examples


# A budgeted search runs in chunks of this many examples, checking the clock
# between chunks (Hypothesis has no wall-clock limit of its own, and an
# exception raised inside its run to stop it is taken for a flaky failure):
# each chunk is seeded from the cell and its index, so a budgeted search is
# reproducible given how many chunks it ran.
CHUNK = 25


def _chunk_seed(release: Release, scenario: Scenario, prop: Property, k: int) -> int:
    return _seed(release, scenario, prop.name, k)


def _seed(release: Release, scenario: Scenario, label: str, k: int) -> int:
    digest = hashlib.sha256(f"{release.name}|{scenario.name}|{label}|{k}".encode())
    return int.from_bytes(digest.digest()[:8], "big")


def check_property(release: Release, scenario: Scenario, prop: Property,
                   profile: str = "ci", database: bool = True,
                   deadline: Optional[float] = None,
                   on_chunk: Optional[Callable[[Stats], None]] = None) -> HypoVerdict:
    """Search for a violation of ``prop`` (or a path to its good state).

    With ``deadline`` (a ``time.monotonic()`` instant) the search stops at
    the profile's examples or at the deadline, whichever comes first, in
    seeded chunks of :data:`CHUNK` examples (``on_chunk(stats)`` after each);
    without it, one run of the profile as it is (the pinned ``ci`` table)."""
    if not prop.applies(release, scenario):
        return HypoVerdict(Verdict(prop.name, prop.kind, "not-applicable"), 0, 0, None, 0.0)
    stats = Stats()
    M = machine(release, scenario, [prop], stats)
    t0 = time.perf_counter()
    found: Optional[Violation] = None
    cut = False
    try:
        if deadline is None:
            run(M, profile_settings(profile, database))
        else:
            total, k = PROFILES[profile]["max_examples"], 0
            while stats.examples < total:
                if time.monotonic() >= deadline:
                    cut = True
                    break
                before = stats.examples
                chunk = settings(profile_settings(profile, database=False), derandomize=False,
                                 max_examples=min(CHUNK, total - stats.examples))
                M._hypothesis_internal_use_seed = _chunk_seed(release, scenario, prop, k)
                run(M, chunk)
                k += 1
                if on_chunk is not None:
                    on_chunk(stats)
                if stats.examples == before:  # nothing left to draw
                    break
    except Violation as v:
        found = v
    seconds = time.perf_counter() - t0
    ctx = Ctx(release=release, scenario=scenario)
    if found is None:
        verdict = "violated" if prop.kind == Kind.SOMETIMES else "holds"
        return HypoVerdict(Verdict(prop.name, prop.kind, verdict), stats.examples, stats.steps,
                           None, seconds, stats.runs, cut)
    steps = minimise(ctx, prop, found.steps)
    trace = _trace(ctx, prop, steps)
    verdict = "holds" if prop.kind == Kind.SOMETIMES else "violated"
    return HypoVerdict(Verdict(prop.name, prop.kind, verdict, trace), stats.examples,
                       stats.steps, len(found.steps), seconds, stats.runs)


def check_together(release: Release, scenario: Scenario, props: Sequence[Property],
                   profile: str, deadline: float,
                   on_chunk: Optional[Callable[[Stats, int], None]] = None
                   ) -> Dict[str, HypoVerdict]:
    """A budgeted search for every property of ``props`` at once (``reqmodel
    check --engine hypothesis`` with a time budget): each run checks all the
    properties not found yet, so a sample serves them all instead of one.
    A find is minimised and its property leaves the search, which goes on
    for the others with the profile's examples anew (as
    :func:`find_in_drawn`), until none is left or the deadline. Chunks are
    seeded from the cell and their index. ``on_chunk(stats, open)`` after
    each, with the number of properties still searched for. Without a budget the engine keeps
    one search per property (the pinned ``ci`` table)."""
    ctx = Ctx(release=release, scenario=scenario)
    remaining = [p for p in props if p.applies(release, scenario)]
    out: Dict[str, HypoVerdict] = {
        p.name: HypoVerdict(Verdict(p.name, p.kind, "not-applicable"), 0, 0, None, 0.0)
        for p in props if not p.applies(release, scenario)}
    stats = Stats()
    total, k, since_find = PROFILES[profile]["max_examples"], 0, 0
    t0 = time.perf_counter()
    cut = False
    while remaining and since_find < total:
        if time.monotonic() >= deadline:
            cut = True
            break
        before = stats.examples
        M = machine(release, scenario, remaining, stats)
        M._hypothesis_internal_use_seed = _seed(release, scenario, "together", k)
        chunk = settings(profile_settings(profile, database=False), derandomize=False,
                         max_examples=min(CHUNK, total - since_find))
        k += 1
        try:
            run(M, chunk)
        except Violation as v:
            p = next(q for q in remaining if q.name == v.prop)
            # a second at least, the budget's share when there is more
            steps = minimise(ctx, p, v.steps, max(deadline, time.monotonic() + 1.0))
            good = "holds" if p.kind == Kind.SOMETIMES else "violated"
            out[p.name] = HypoVerdict(Verdict(p.name, p.kind, good, _trace(ctx, p, steps)),
                                      stats.examples, stats.steps, len(v.steps),
                                      time.perf_counter() - t0, stats.runs)
            remaining = [q for q in remaining if q.name != p.name]
            since_find = 0
            continue
        finally:
            if on_chunk is not None:
                on_chunk(stats, len(remaining))
        since_find += stats.examples - before
        if stats.examples == before:  # nothing left to draw
            break
    for p in remaining:
        none = "violated" if p.kind == Kind.SOMETIMES else "holds"
        out[p.name] = HypoVerdict(Verdict(p.name, p.kind, none), stats.examples, stats.steps,
                                  None, time.perf_counter() - t0, stats.runs, cut)
    return out


def _trace(ctx: Ctx, prop: Property, steps: Sequence[Step]) -> Trace:
    states, events, _ = replay(ctx.release, ctx.scenario, steps)
    kind = "reached" if prop.kind == Kind.SOMETIMES else (
        "state" if not prop.holds_in(states[-1]) else "transition")
    return Trace(release=ctx.release.name, scenario=ctx.scenario.name, property=prop.name,
                 steps=tuple(steps), states=tuple(states), events=tuple(events), violation=kind)


# --------------------------------------------------------------- drawn scenarios

def scenarios(max_requests: int = 6, max_prompt: int = 8, max_pool: int = 12,
              events: bool = True, max_ranks: int = 4) -> st.SearchStrategy:
    """Scenarios beyond the exhaustive checker's bounds: more requests, longer
    prompts, bigger pools, more decode or prefill ranks, shared bootstrap
    rooms, every option and event."""
    @st.composite
    def draw(d):
        n = d(st.integers(1, max_requests))
        prompts = tuple(d(st.lists(st.integers(1, max_prompt), min_size=n, max_size=n)))

        def worker(role: str) -> Worker:
            pool = d(st.integers(1, max_pool))
            return Worker(
                pool_pages=pool, intake_limit_pages=d(st.integers(1, pool)),
                auto_truncate=d(st.booleans()), kv_checksum=d(st.booleans()),
                metadata_buffers=d(st.integers(1, n + 1)),
                chunk_pages=d(st.integers(0, 3)) if role == "prefill" else 0,
                radix_cache=d(st.booleans()) if role == "decode" else False,
                ranks=d(st.integers(1, max_ranks)) if role == "decode" else 1)

        prefill, decode = worker("prefill"), worker("decode")
        ev = Events(**{k: (tuple(sorted(d(st.sets(st.integers(0, n - 1))))) if events else ())
                       for k in EVENT_NAMES})
        # half the scenarios give every request its own room; the others let
        # the client reuse rooms (requests with equal labels share one)
        rooms = d(st.one_of(st.just(()), st.lists(st.integers(1, n), min_size=n, max_size=n)))
        if decode.ranks == 1:  # several prefill ranks need one decode rank (drawn last)
            prefill = attrs.evolve(prefill, ranks=d(st.integers(1, max_ranks)))
        # --disable-overlap-schedule on decode (drawn after the workers and rooms,
        # so their draws keep the values they had before the option)
        decode = attrs.evolve(decode, overlap_schedule=d(st.booleans()))
        return Scenario(
            name=f"drawn-{n}", prompt_pages=prompts, prefill=prefill, decode=decode,
            optimistic_prefill_attempts=d(st.integers(0, 2)),
            deferred_release=d(st.sampled_from([None, True, False])),
            layouts_match=d(st.booleans()), sessions=d(st.booleans()),
            events=ev, bootstrap_rooms=tuple(rooms),
            reuse_room_after=d(st.sampled_from(["both", "decode"])),
            client_abort_reaches=d(st.sampled_from(["both", "prefill", "decode"])),
            # drawn last, so every earlier draw keeps its value
            room_users=d(st.sampled_from(["sequential", "concurrent"])),
            description="drawn by reqmodel.hypo.scenarios()")
    return draw()


@attrs.frozen
class Finding:
    property: str
    scenario: Scenario
    steps: Tuple[Step, ...]


def find_in_drawn(release: Release, props: Sequence[Property], profile: str = "ci",
                  strategy: Optional[st.SearchStrategy] = None) -> List[Finding]:
    """Search drawn scenarios for violations, one property at a time: each run
    stops at its first violation, which is minimised and recorded, and the
    search goes on for the properties not yet found."""
    remaining = [p for p in props if p.kind == Kind.ALWAYS]
    found: List[Finding] = []
    strategy = strategy if strategy is not None else scenarios()
    while remaining:
        M = machine(release, strategy, remaining)
        try:
            run(M, profile_settings(profile, database=False))
        except Violation as v:
            prop = next(p for p in remaining if p.name == v.prop)
            ctx = Ctx(release=release, scenario=v.scenario)
            found.append(Finding(v.prop, v.scenario, minimise(ctx, prop, v.steps)))
            remaining = [p for p in remaining if p.name != v.prop]
            continue
        break
    return found
