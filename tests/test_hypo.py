"""The Hypothesis engine's own machinery: run schedules and minimisation."""
import random

from reqmodel.engines import exhaustive as explore
from reqmodel.engines.hypothesis import engine as hypo
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.model.actions import Ctx, Step

INCIDENT = scenario.builtin("incident")
CTX19 = Ctx(release=releases.get("0.5.19"), scenario=INCIDENT)
REJECTED = properties.CATALOG["rejected-never-succeeds"]

# the rejected request answered 200 by decode: 15 steps, none of which can be
# deleted; the shortest answer-200 is prefill's own, 12 steps
DECODE_200 = ("d_intake d_door d_prealloc p_intake p_door p_recv_metadata p_pop_bootstrapped "
              "p_forward p_result xfer_dequeue xfer_write d_recv_status d_transferred d_attend "
              "d_respond").split()


def decode_200_trace():
    steps = hypo.until_hit(CTX19, REJECTED, [Step(a, 0, ()) for a in DECODE_200], repair=True)
    assert steps is not None and [s.action for s in steps] == DECODE_200
    return steps


def test_deleting_steps_cannot_shorten_a_trace_with_a_longer_ending():
    steps = decode_200_trace()
    assert hypo.delete_steps(CTX19, REJECTED, steps) == steps


def test_the_tail_search_finds_the_shorter_ending():
    steps = decode_200_trace()
    shorter = hypo.shorten_tail(CTX19, REJECTED, steps)
    assert shorter is not None and len(shorter) == 12
    assert shorter[:10] == steps[:10] and shorter[-1].action == "p_inflight"
    assert hypo.breaks(CTX19, REJECTED, shorter) == 12
    shortest = explore.explore(releases.get("0.5.19"), INCIDENT, [REJECTED])
    assert len(hypo.minimise(CTX19, REJECTED, steps)) == shortest.verdicts[REJECTED.name].trace_length


def test_the_tail_search_stops_at_its_budget_and_at_the_shortest():
    steps = decode_200_trace()
    assert hypo.shorten_tail(CTX19, REJECTED, steps, budget=1) is None
    assert hypo.shorten_tail(CTX19, REJECTED, hypo.minimise(CTX19, REJECTED, steps)) is None


def test_schedules_are_a_function_of_the_seed():
    sc = scenario.builtin("optimistic-abort-unit")
    a = hypo.draw_schedule(random.Random("7|x"), sc)
    assert a == hypo.draw_schedule(random.Random("7|x"), sc)
    assert a != hypo.draw_schedule(random.Random("7|y"), sc)


def test_schedules_mix_priority_and_delay_runs_and_spread_timers():
    sc = scenario.builtin("optimistic-abort-unit")
    pairs, _, events = hypo._run_space(sc)
    rnd = random.Random(1)
    kinds, timers, releases_of_pairs = set(), set(), set()
    for _ in range(200):
        t, rank, delayed = hypo.draw_schedule(rnd, sc)
        assert set(t) == set(events)
        timers.update(t.values())
        if rank is None:
            kinds.add("delay")
            for key, at in delayed.items():
                if key in pairs:
                    releases_of_pairs.add("step" if isinstance(at, int) else at)
                else:
                    assert at is None or isinstance(at, int)  # threads are never overtaken
        else:
            kinds.add("priority")
            assert sorted(rank.values()) == list(range(len(pairs))) and not delayed
    assert kinds == {"priority", "delay"}
    assert timers == set(range(hypo.EVENT_HORIZON + 2))
    assert releases_of_pairs == {"step", None, hypo.OVERTAKEN}


def test_an_overtaken_pair_waits_until_another_request_takes_the_step():
    M = hypo.machine(releases.get("0.5.19"), INCIDENT, [])
    rules = hypo.rules_of(M)
    m = M()
    rules["start"].function(m, ZeroSeeds())
    m._rank, m._timers, m._delayed = None, {}, {("p_intake", 0): hypo.OVERTAKEN}
    m._enabled_for = None
    assert m.enabled_map()["p_intake"] == [1]  # request 0 waits for request 1
    rules["d_intake"].function(m, ZeroSeeds())  # another action does not release it
    assert m.enabled_map()["p_intake"] == [1]
    rules["p_intake"].function(m, ZeroSeeds())  # request 1 takes the step
    assert m.steps[-1] == Step("p_intake", 1, ())
    assert m.enabled_map()["p_intake"] == [0]
    # alone, a request is not held for ever: with nothing else to move it goes
    m2 = M()
    rules["start"].function(m2, ZeroSeeds())
    m2._rank, m2._timers = None, {}
    m2._delayed = {(a, r): hypo.OVERTAKEN for a in ("p_intake", "d_intake") for r in (0, 1)}
    m2._enabled_for = None
    assert m2.enabled_map()["p_intake"] == [0, 1]


class ZeroSeeds:
    """Hypothesis often draws the simplest value; here every seed is 0."""

    def draw(self, strategy, label=None):
        return 0


def test_runs_of_one_example_differ_even_when_every_seed_is_zero():
    sc = scenario.builtin("optimistic-abort-unit")
    M = hypo.machine(releases.get("0.5.19"), sc, [properties.CATALOG["abort-is-terminal"]])
    rules = {n: r.function for n, r in hypo.rules_of(M).items()}
    m = M()
    rules["start"](m, ZeroSeeds())
    first = (m._timers, m._rank, m._delayed)
    for _ in range(5):
        name = next(k for k, v in m.enabled_map().items() if v)
        rules[name](m, ZeroSeeds())
    rules["start"](m, ZeroSeeds())
    assert (m._timers, m._rank, m._delayed) != first


def test_the_rule_strategy_draws_exactly_the_rules_whose_precondition_holds():
    """``EnabledRules`` reads ``enabled_rules()`` instead of asking each
    rule's precondition; on random runs of every built-in scenario the two
    name the same rules at every step (and the machine's actions all have a
    rule, and only they: a step the release's code does not have is none)."""
    from reqmodel.model.actions import ACTIONS
    rnd = random.Random(4)
    for name in scenario.builtin_names():
        sc = scenario.builtin(name)
        rel = releases.get(rnd.choice(releases.NAMES))
        M = hypo.machine(rel, sc, [])
        rules = hypo.rules_of(M)
        assert set(rules) == {a.name for a in ACTIONS if a.on(rel)} | {"start"}
        m = M()
        data = hypo.RandomData(rnd)
        for _ in range(120):
            by_precondition = {n for n, r in rules.items()
                               if all(p(m) for p in r.preconditions)}
            assert m.enabled_rules() == by_precondition, (name, len(m.steps))
            rules[rnd.choice(sorted(by_precondition))].function(m, data)


class _Always(random.Random):
    def __init__(self, u):
        super().__init__(0)
        self.u = u

    def random(self):
        return self.u


def test_an_event_can_be_armed_again_after_it_fires():
    """Events fire when their timer is due; half the time one is armed again
    for a later step of its request, so a run can see an event twice where the
    model allows it (a request's transfer failing, then its stale write)."""
    sc = scenario.builtin("transfer-failure")
    M = hypo.machine(releases.get("0.5.21"), sc, [])
    rules = hypo.rules_of(M)
    for u, armed_again in ((0.0, True), (0.99, False)):
        m = M()
        rules["start"].function(m, ZeroSeeds())
        m._rank, m._delayed, m._rnd = None, {}, _Always(u)
        m._timers = {("xfer_fail", 0): 0}
        while "xfer_fail" not in m.enabled_rules():
            name = sorted(m.enabled_rules())[0]
            assert name != "start", "the failure never became possible"
            rules[name].function(m, ZeroSeeds())
        rules["xfer_fail"].function(m, ZeroSeeds())
        progress = m._progress[("P", 0)]
        if armed_again:
            assert progress < m._timers[("xfer_fail", 0)] <= progress + hypo.EVENT_HORIZON + 1
        else:
            assert ("xfer_fail", 0) not in m._timers


def test_the_private_hypothesis_api_the_engine_uses_is_there():
    """Every private access is in engines/hypothesis/shim.py; the installed
    Hypothesis must still have each of them."""
    from reqmodel.engines.hypothesis import shim
    assert shim.missing() == []


def test_constant_injection_is_off_inside_the_shim_and_restored_after():
    from hypothesis.internal.conjecture import providers
    from reqmodel.engines.hypothesis import shim
    before = providers.HypothesisProvider._maybe_draw_constant
    with shim.no_constant_injection():
        assert providers.HypothesisProvider._maybe_draw_constant is not before
        assert providers.HypothesisProvider._maybe_draw_constant(None) is None
    assert providers.HypothesisProvider._maybe_draw_constant is before


def test_drawn_conformance_cases_are_drawn_without_constant_injection(monkeypatch):
    """Hypothesis mixes the literals of the modules loaded so far into its
    draws: the conformance cases drawn from scenarios then changed with what
    the process had imported (5,507 / 5,487 / 5,745 cases for 0.5.22). The
    case generator draws inside ``no_constant_injection``, as the engine."""
    import contextlib

    from reqmodel.conform import cases
    from reqmodel.engines.hypothesis import shim
    from reqmodel.model import releases

    inside = []
    real = shim.no_constant_injection

    @contextlib.contextmanager
    def spy():
        with real():
            inside.append(True)
            yield

    monkeypatch.setattr(shim, "no_constant_injection", spy)
    col = cases.from_drawn(releases.get("0.5.22"), target=1, max_examples=3, walk_steps=3)
    assert inside and col.step_cases >= 0


def test_a_deadline_stops_minimising_with_a_trace_that_still_breaks():
    """A budgeted search's minimisation gives up at the deadline: the
    breadth-first search answers None, and minimise returns the trace it has,
    which still breaks the property (not necessarily the shortest)."""
    import time
    steps = decode_200_trace()
    past = time.monotonic() - 1
    s0 = hypo.initial_state(INCIDENT)
    assert hypo._shortest_hit(CTX19, REJECTED, s0, len(steps), 10_000, past) is None
    assert hypo._shortest_hit(CTX19, REJECTED, s0, len(steps), 10_000) is not None
    cut = hypo.minimise(CTX19, REJECTED, steps, deadline=past)
    assert hypo.breaks(CTX19, REJECTED, cut) == len(cut) and len(cut) <= len(steps)
    assert len(cut) > 12  # the shortest is 12: the searches did not run


def test_a_budgeted_search_for_every_property_at_once_finds_only_real_violations():
    """check_together (the budgeted CLI's search) shares each run among the
    properties not found yet: each violation it reports replays, is one the
    exhaustive engine finds too, and a found property leaves the search;
    the chunks are seeded, so the same call finds the same."""
    import time
    rel = releases.get("0.5.19")
    props = [p for p in properties.CATALOG.values() if p.kind == properties.Kind.ALWAYS]
    got = hypo.check_together(rel, INCIDENT, props, "dev", time.monotonic() + 600)
    assert set(got) == {p.name for p in props}
    ex = explore.explore(rel, INCIDENT, props, keep_graph=False)
    found = {n for n, hv in got.items() if hv.verdict.verdict == "violated"}
    assert {"reject-acquires-nothing", "rejected-never-succeeds"} <= found
    for name in found:
        assert ex.verdicts[name].verdict == "violated", name
        trace = got[name].verdict.trace
        assert hypo.breaks(CTX19, properties.CATALOG[name], trace.steps) == len(trace.steps)
    assert got["reject-acquires-nothing"].verdict.trace_length == 2
    again = hypo.check_together(rel, INCIDENT, props, "dev", time.monotonic() + 600)
    assert {n for n, hv in again.items() if hv.verdict.verdict == "violated"} == found
