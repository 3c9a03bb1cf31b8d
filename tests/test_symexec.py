"""The learned paths of the actions (reqmodel.symexec) and the Z3 engine built
on them (reqmodel.bmc), checked against the explicit model."""
import collections

import pytest

from reqmodel.engines.z3 import bmc
from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.engines.z3 import action_paths as sx
from reqmodel.model.actions import Ctx, Step, successors

SAFETY = [p for p in properties.CATALOG.values() if p.kind == "always"]


def reachable(rel, sc):
    ex = explore.explore(rel, sc, SAFETY, stop_early=False, keep_graph=False, symmetry=False,
                         keep_states=True)
    assert ex.complete
    return ex.state_of


def learned_everywhere(lay, ctx, states):
    """Every path of every action instance taken on these states."""
    by_inst = collections.defaultdict(dict)
    for s in states:
        v = lay.values(s)
        for a, r in sx.instances(ctx):
            for c in sx.learn(lay, v, a, r, SAFETY):
                by_inst[(c.action, c.rid)].setdefault(c.cond, []).append(c)
    return by_inst


@pytest.mark.parametrize("release,sc", [("0.5.19", "incident"), ("0.5.21", "incident"),
                                        ("0.5.22", "transfer-failure")])
def test_every_learned_path_is_the_concrete_step_wherever_it_matches(release, sc):
    """A clause learned on one state is claimed for every state that agrees on
    the slots it read: on every reachable state, the clauses that match give
    exactly the concrete successors, with the same events and verdicts."""
    rel, scen = releases.get(release), scenario.builtin(sc)
    ctx = Ctx(rel, scen)
    states = reachable(rel, scen)
    lay = sx.Layout.of(ctx, 8)
    by_inst = learned_everywhere(lay, ctx, states)
    preds = collections.defaultdict(dict)
    for s in states:
        for p in properties.CATALOG.values():
            if p.state:
                cond, good = sx.learn_predicate(lay, lay.values(s), p.state)
                preds[p.name][cond] = good
    for s in states:
        v = lay.values(s)
        want = {(st.action, st.rid, tuple(st.arg)): (nxt, evs)
                for st, nxt, evs in successors(ctx, s)}
        got = {}
        for (name, r), paths in by_inst.items():
            matching = [cond for cond in paths if sx.satisfied(cond, v)]
            assert len(matching) == 1, f"{name}(r{r}): {len(matching)} paths match one state"
            for c in paths[matching[0]]:
                if c.arg is None:
                    continue
                nxt = lay.state(c.apply(v))
                got[(name, r, c.arg)] = nxt
                want_nxt, want_evs = want[(name, r, c.arg)]
                assert nxt == want_nxt, f"{c.step} from a state it was not learned on"
                assert c.events == tuple(want_evs)
                assert set(c.broken) == {p.name for p in SAFETY if p.transition and not
                                         p.holds_on(s, Step(name, r, c.arg), want_evs, want_nxt)}
        assert set(got) == set(want)
        for p in properties.CATALOG.values():
            if p.state:
                matching = [good for cond, good in preds[p.name].items()
                            if sx.satisfied(cond, v)]
                assert matching == [p.state(s)], p.name


def test_a_path_reads_only_what_the_action_looks_at():
    """The frame is not read: intake on prefill reads its own request's stage
    and the room's previous user, not the other requests or the pages."""
    rel, scen = releases.get("0.5.21"), scenario.builtin("incident")
    ctx = Ctx(rel, scen)
    lay = sx.Layout.of(ctx, 4)
    from reqmodel.model.actions import BY_NAME, initial_state
    (c,) = sx.learn(lay, lay.values(initial_state(scen)), BY_NAME["p_intake"], 0)
    # a step is enabled only while no scheduler has died (Action.enabled
    # reads State.crashed): the crash flags are the one read of every record
    read = {k for k, _ in c.cond if k[2:] != ("crashed",)}
    assert ("p", 0, "stage") in read
    assert {k for k, _ in c.cond if k[2:] == ("crashed",)} == {
        (side, r, "crashed") for side in ("p", "d") for r in range(scen.n)}
    assert not any(k[0] in ("d_pages", "rooms", "net") or k[:2] == ("p", 1) for k in read)
    assert dict(c.effect)[("p", 0, "stage")][0] == "const"


def test_a_step_beyond_the_message_slots_is_refused():
    rel, scen = releases.get("0.5.19"), scenario.builtin("incident")
    ctx = Ctx(rel, scen)
    states = reachable(rel, scen)
    busiest = max(states, key=lambda s: len(s.net))
    lay = sx.Layout.of(ctx, len(busiest.net) - 1)
    with pytest.raises(sx.NetBound):
        lay.values(busiest)


@pytest.mark.parametrize("release,sc,prop,length", [
    ("0.5.19", "both-reject", "rejected-never-succeeds", 12),
    ("0.5.19", "both-reject", "reject-acquires-nothing", 2),
    ("0.5.20", "decode-reject", "aborted-not-preallocated", 3),
])
def test_z3_finds_the_exhaustive_engines_shortest_violation(release, sc, prop, length):
    """The first depth at which Z3 finds a violation is the breadth-first
    shortest length, and its trace replays on the explicit model."""
    rel, scen, p = releases.get(release), scenario.builtin(sc), properties.CATALOG[prop]
    ex = explore.explore(rel, scen, [p])
    assert ex.verdicts[prop].trace_length == length
    r = bmc.check(rel, scen, p, length + 2)
    assert (r.verdict, r.depth) == ("violated", length)
    assert len(r.trace.steps) == length
    assert p.hit(r.trace.states[-2], r.trace.steps[-1], r.trace.events[-1], r.trace.states[-1])


def test_z3_proves_what_holds_once_no_simple_path_is_left():
    """0.5.21's door retires the rejected request: its whole reachable space is
    4 steps deep, so there is no simple path of 5 steps, and what did not
    break by then is proved, not only held to the depth asked."""
    rel, scen = releases.get("0.5.21"), scenario.builtin("both-reject")
    for name in ("rejected-never-succeeds", "reject-acquires-nothing", "aborted-not-preallocated"):
        r = bmc.check(rel, scen, properties.CATALOG[name], 8)
        assert (r.verdict, r.depth, r.trace) == ("proved", 5, None)


def test_z3_holds_only_to_the_depth_searched_on_a_deeper_space():
    """incident is 21 steps deep on 0.5.21: four steps prove nothing."""
    rel, scen = releases.get("0.5.21"), scenario.builtin("incident")
    r = bmc.check(rel, scen, properties.CATALOG["no-foreign-kv-read"], 4)
    assert (r.verdict, r.depth) == ("holds-to-depth", 4)
    r = bmc.check(rel, scen, properties.CATALOG["valid-request-completes"], 4)
    assert (r.verdict, r.depth) == ("unreached-to-depth", 4)


def test_an_unlearned_path_is_not_taken_as_absent():
    """The completeness question is what makes "holds" sound: with the
    relation only as learned on the initial state, Z3 finds no 12-step
    violation (the intake steps are all it knows).  The engine refines until
    every state within the depth has all its paths learned, and then finds it."""
    from reqmodel.model.actions import initial_state
    rel, scen = releases.get("0.5.19"), scenario.builtin("both-reject")
    p = properties.CATALOG["rejected-never-succeeds"]
    lay = sx.Layout.of(Ctx(rel, scen), 8)
    R = bmc.Relation(lay, [p])
    v0 = lay.values(initial_state(scen))
    R.learn_at(v0)
    u = bmc.Unrolling(R, v0, 12)
    u.solver.add(u.hit(12, p))
    assert str(u.solver.check()) == "unsat"
    r = bmc.check(rel, scen, p, 12)
    assert r.refinements > 0 and (r.verdict, r.depth) == ("violated", 12)
