"""Hangs, spins and crashes as verdicts (notes/liveness.md): the liveness
analysis on hand-made graphs, the properties on the built-in scenarios and
mutants, lasso traces through ITF, replay and rendering, timeouts as
declared data, and the partial forms of the engines that see no graph."""
import json
import pathlib
import subprocess
import sys

import attrs
import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reqmodel.engines import liveness
from reqmodel.engines.base import Answer, Hypothesis, Z3
from reqmodel.engines.exhaustive import explore
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import ACTIONS, BY_NAME, Ctx, Step
from reqmodel.proposals import mutants
from reqmodel.traces import itf, render
from reqmodel.traces import replay as rp

ROOT = pathlib.Path(__file__).parent.parent
AWT = properties.CATALOG["answered-without-timeout"]
NL = properties.CATALOG["no-livelock"]
NSC = properties.CATALOG["no-scheduler-crash"]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def verdict(release, name, prop):
    rel = mutants.MUTANTS.get(release) or releases.get(release)
    return explore(rel, scenario.builtin(name), [prop], keep_graph=False).verdicts[prop.name]


# ------------------------------------------------- the analysis on small graphs


@attrs.frozen
class Fake:
    """A stand-in state: one request, waiting or not."""

    name: str
    waits: bool

    @property
    def p(self):
        return (None,)


def graph(states, edges):
    e = liveness.Edges()
    for u, v, action in edges:
        e.add(u, v, Step(action, 0), not BY_NAME[action].environment)
    return e


def waits(s, r):
    return s.waits


def test_a_cycle_that_leaves_an_always_enabled_step_untaken_is_unfair():
    # 0 -> 1 -> 2 -> 1 cycles on p_forward/p_result; p_inflight is enabled on
    # both cycle states and would leave the cycle (to 3, where nobody waits)
    states = [Fake("s0", True), Fake("s1", True), Fake("s2", True), Fake("s3", False)]
    unfair = graph(states, [(0, 1, "p_intake"), (1, 2, "p_forward"), (2, 1, "p_result"),
                            (1, 3, "p_inflight"), (2, 3, "p_inflight")])
    assert liveness.first_lasso(states, unfair, waits) is None
    # enabled on one state only: not continuously enabled, so the cycle is fair
    fair = graph(states, [(0, 1, "p_intake"), (1, 2, "p_forward"), (2, 1, "p_result"),
                          (1, 3, "p_inflight")])
    lasso = liveness.first_lasso(states, fair, waits)
    assert lasso is not None and lasso.path == (0, 1) and lasso.cycle == (2, 1)


def test_environment_steps_are_no_way_out_and_no_obligation():
    # the only way to an answer is a timeout: stuck; the cycle is closed by
    # own steps while a timeout is enabled on every state of it: still fair
    states = [Fake("s0", True), Fake("s1", True), Fake("s2", False)]
    e = graph(states, [(0, 1, "p_forward"), (1, 0, "p_result"), (0, 2, "d_waiting_timeout"),
                       (1, 2, "d_waiting_timeout")])
    stuck = liveness.first_stuck(states, e, lambda s, r: not s.waits, waits)
    assert stuck is not None and stuck.path == (0,)
    assert liveness.first_lasso(states, e, waits) is not None


def test_a_state_reached_only_through_a_timeout_is_not_asked():
    states = [Fake("s0", False), Fake("s1", True)]
    e = graph(states, [(0, 1, "p_bootstrap_timeout")])
    assert liveness.first_stuck(states, e, lambda s, r: not s.waits, waits) is None


# ---------------- the analysis against its definitions, on random graphs
#
# The analysis runs its reachability and components in scipy (C); here the
# same definitions are written plainly with networkx, and both must give the
# same stuck state and the same lasso (path and cycle) on random graphs with
# own steps, environment steps and timeouts, two requests and random goals.


@attrs.frozen
class Two:
    """A stand-in state with two requests: per request, waiting or not."""

    waits: tuple

    @property
    def p(self):
        return (None, None)


STEPS = ("p_forward", "p_result", "p_inflight", "d_waiting_timeout")


def _own_graph(n, edges):
    g = nx.MultiDiGraph()
    g.add_nodes_from(range(n))
    for u, v, i, own in zip(edges.src, edges.dst, edges.inst, edges.mine):
        if own:
            g.add_edge(u, v, inst=i)
    return g


def stuck_by_definition(states, edges, goal, pending):
    n = len(states)
    g = _own_graph(n, edges)
    cond = nx.condensation(g)
    bottom = {v for c in cond if cond.out_degree(c) == 0 for v in cond.nodes[c]["members"]}
    order, parent = liveness._untimed(n, edges)
    best = None
    for r in range(2):
        goals = {v for v in range(n) if goal(states[v], r)}
        can = goals.union(*(nx.ancestors(g, v) for v in goals))
        bad = [k for k, v in enumerate(order)
               if v not in can and v in bottom and pending(states[v], r)]
        if any(v not in can and pending(states[v], r) for v in order):
            assert bad, "a waiting state that cannot reach the goal leads to a bottom one"
            if best is None or bad[0] < best[0]:
                best = (bad[0], r)
    return None if best is None else liveness.Stuck(best[1], liveness._path_to(order[best[0]], parent))


def lasso_by_definition(states, edges, pending):
    n = len(states)
    g = _own_graph(n, edges)
    order, parent = liveness._untimed(n, edges)
    rank = {v: k for k, v in enumerate(order)}
    enabled_at = {v: {i for _, _, i in g.out_edges(v, data="inst")} for v in range(n)}
    best = None
    for r in range(2):
        sub = g.subgraph([v for v in range(n) if pending(states[v], r)])
        for comp in nx.strongly_connected_components(sub):
            if len(comp) == 1 and not sub.has_edge(next(iter(comp)), next(iter(comp))):
                continue
            taken = {i for u, v, i in sub.edges(data="inst") if u in comp and v in comp}
            if set.intersection(*(enabled_at[v] for v in comp)) - taken:
                continue
            entries = [v for v in comp if v in rank]
            if entries:
                entry = min(entries, key=rank.__getitem__)
                if best is None or rank[entry] < best[0]:
                    best = (rank[entry], r, entry, set(comp))
    if best is None:
        return None
    _, r, entry, members = best
    return liveness.Lasso(r, liveness._path_to(entry, parent),
                          liveness._fair_cycle(entry, members, edges, enabled_at))


def unbounded_by_definition(states, edges, goal, pending, armed):
    """AG EF goal through own steps and the timeouts a state arms: the least
    state that waits, cannot reach its goal by own steps, and from which own
    steps reach no state with a timeout armed (every such state is in a
    bottom component with none armed, and the first one is)."""
    n = len(states)
    g = _own_graph(n, edges)
    cond = nx.condensation(g)
    bottom = {v for c in cond if cond.out_degree(c) == 0 for v in cond.nodes[c]["members"]}
    best = None
    for r in range(2):
        goals = {v for v in range(n) if goal(states[v], r)}
        can = goals.union(*(nx.ancestors(g, v) for v in goals))
        for v in range(n):
            ahead = nx.descendants(g, v) | {v}
            if (v not in can and v in bottom and pending(states[v], r)
                    and not any(armed(states[u]) for u in ahead)):
                if best is None or v < best[0]:
                    best = (v, r)
                break
    return best


def test_a_wait_a_timeout_ends_is_bounded_and_one_after_it_is_asked_too():
    # 0 waits; own steps lead nowhere; a timeout armed at 0 fires to 1, which
    # still waits with nothing armed: 0 is bounded, 1 is not (though reached
    # only through a timeout, which answered-without-timeout does not ask)
    states = [Fake("s0", True), Fake("s1", True), Fake("s2", False)]
    e = graph(states, [(0, 1, "d_waiting_timeout")])
    armed = lambda s: s.name == "s0"  # noqa: E731
    goal = lambda s, r: not s.waits  # noqa: E731
    assert liveness.first_unbounded(states, e, goal, waits, armed) == (1, 0)
    assert liveness.first_stuck(states, e, goal, waits).path == (0,)
    # an own step from 1 to an answer: bounded everywhere
    e = graph(states, [(0, 1, "d_waiting_timeout"), (1, 2, "p_inflight")])
    assert liveness.first_unbounded(states, e, goal, waits, armed) is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=n, max_size=n),
    st.lists(st.booleans(), min_size=n, max_size=n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1),
                       st.sampled_from(STEPS), st.integers(0, 1)), max_size=4 * n))))
def test_the_analysis_agrees_with_its_definitions_on_random_graphs(case):
    marks, armed, arcs = case
    states = [Two(w) for w in marks]
    edges = liveness.Edges()
    for u, v, action, rid in [(0, 1, "p_forward", 0)] + arcs:
        edges.add(u, v, Step(action, rid), not BY_NAME[action].environment)
    # the goal is the end of the wait, as for the catalogue's properties: a
    # state that cannot reach it leads to a bottom state that still waits
    goal = lambda s, r: not s.waits[r]  # noqa: E731
    pending = lambda s, r: s.waits[r]  # noqa: E731
    assert liveness.first_stuck(states, edges, goal, pending) == \
        stuck_by_definition(states, edges, goal, pending)
    assert liveness.first_lasso(states, edges, pending) == lasso_by_definition(states, edges, pending)
    # and with a timeout armed on some states: the waits that nothing ends
    is_armed = dict(zip(map(id, states), armed))
    arm = lambda s: is_armed[id(s)]  # noqa: E731
    assert liveness.first_unbounded(states, edges, goal, pending, arm) == \
        unbounded_by_definition(states, edges, goal, pending, arm)


# ------------------------------------------------------- the built-in verdicts


@pytest.mark.parametrize("release,cell", [("0.5.19", None), ("0.5.20", 9), ("0.5.21", None),
                                          ("0.5.22", None), ("0.5.23", None)])
def test_both_reject_hangs_on_0520_only(release, cell):
    """The write-up's measurement of #38935: before it, a prompt both workers
    reject kept decode waiting for its 300 s timeout; after it, both doors answer."""
    v = verdict(release, "both-reject", AWT)
    assert v.trace_length == cell
    if cell:
        assert v.trace.rid == 0
        assert [(a, r, s) for a, r, _, s in v.trace.ends_by] == [("d_waiting_timeout", 0, 300)]


@pytest.mark.parametrize("release", releases.NAMES)
def test_two_valid_requests_hold_every_liveness_property(release):
    rel = releases.get(release)
    ex = explore(rel, scenario.builtin("two-valid"), [AWT, NL, NSC], keep_graph=False)
    assert {n: v.verdict for n, v in ex.verdicts.items()} == {
        AWT.name: "holds", NL.name: "holds", NSC.name: "holds"}


def test_the_capacity_stall_of_optimistic_prefill():
    """sgl-project/sglang#31473: each worker holds the pages the other needs."""
    v = verdict("0.5.23", "optimistic-tight", AWT)
    assert v.verdict == "violated" and v.trace_length == 14
    last = v.trace.states[-1]
    assert {a for a, *_ in v.trace.ends_by} == {"d_waiting_timeout", "p_bootstrap_timeout"}
    assert last.p[1].pending_bootstrap and last.p[1].kv_pages == 2


def test_the_mutant_that_requeues_for_ever_livelocks():
    v = verdict("requeue-forever", "optimistic-tight", NL)
    t = v.trace
    assert v.verdict == "violated" and t.loop is not None
    assert t.states[-1] == t.states[t.loop]
    assert {s.action for s in t.steps[t.loop:]} == {"p_forward", "p_check_chunked", "p_result"}
    assert verdict("0.5.21", "optimistic-tight", NL).verdict == "holds"


def test_release_kv_cache_assertion_is_a_crash_unless_the_cache_keeps_mamba():
    v = verdict("0.5.19", "late-result-unit", NSC)
    crash = [e for e in v.trace.events[-1] if e.kind == "crash"]
    assert crash and crash[0].call == "release_kv_cache" and crash[0].error == "AssertionError"
    mamba = attrs.evolve(scenario.builtin("late-result-unit"), hybrid_mamba=True)
    ex = explore(releases.get("0.5.19"), mamba, [NSC], keep_graph=False)
    assert ex.verdicts[NSC.name].verdict == "holds"


def test_no_poll_of_popped_room_is_the_decode_case_of_no_scheduler_crash():
    v = verdict("0.5.21", "room-reuse-three", properties.CATALOG["no-poll-of-popped-room"])
    crash = [e for e in v.trace.events[-1] if e.kind == "crash"]
    assert crash[0].side == "decode" and crash[0].call == "check_status"
    # prefill's pop_bootstrapped crash on a room's earlier Success is
    # no-scheduler-crash's alone
    v = verdict("0.5.19", "pause-abort", NSC)
    assert [e.call for e in v.trace.events[-1] if e.kind == "crash"] == ["pop_bootstrapped"]
    assert verdict("0.5.19", "pause-abort",
                   properties.CATALOG["no-poll-of-popped-room"]).verdict == "holds"


# --------------------------------------------- timeouts are declared data


def test_every_timeout_names_a_variable_every_release_defines():
    timeouts = [a for a in ACTIONS if a.timeout is not None]
    assert {a.name for a in timeouts} == {"p_bootstrap_timeout", "d_waiting_timeout",
                                          "d_deferred_timeout"}
    for rel in releases.RELEASES.values():
        for a in timeouts:
            assert rel.timeout_seconds(a.timeout) > 0
        assert rel.timeout_seconds("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT") == 30
    for a in ACTIONS:  # a timeout is never the deployment's own progress
        assert a.environment or a.timeout is None


def test_the_waste_figures_read_the_release_record():
    from reqmodel.proposals import guard_check
    slow = attrs.evolve(releases.get("0.5.21"), timeouts=(
        ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300),
        ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 600),
        ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30)))
    assert guard_check.timeout_seconds(slow)["d_waiting_timeout"] == 600
    cost = guard_check.measure(slow, scenario.builtin("incident"))
    assert cost["peer_hold_seconds"] == 600


# ----------------------------------------------- traces: ITF, replay, show


def _write(tmp_path, release, name, prop):
    v = verdict(release, name, prop)
    path = tmp_path / f"{prop.name}.itf.json"
    itf.write(path, v.trace, scenario.builtin(name))
    return path, v


def test_a_stuck_trace_replays_and_shows_what_ends_it(tmp_path):
    path, v = _write(tmp_path, "0.5.20", "both-reject", AWT)
    data = json.loads(path.read_text())
    assert data["#meta"]["request"] == 0
    assert data["#meta"]["ends_by"][0]["env"] == "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
    out = rp.run(rp.load(path))
    assert out.violated and out.violated_at == 9
    # on 0.5.21 the trace does not even replay: the prefill door retires the stub
    assert rp.run(rp.load(path, release="0.5.21")).first_disabled_step is not None
    r = run("show", str(path))
    assert r.returncode == 0 and "only a timeout ends it, the first after 300 s" in r.stdout
    r = run("show", str(path), "--format", "mermaid")
    assert "r0 waits: only a timeout ends it" in r.stdout
    r = run("replay", str(path))
    assert r.returncode == 0 and "VIOLATED at step 9" in r.stdout


def test_a_stuck_trace_on_a_release_that_answers_is_not_violated(tmp_path):
    path, _ = _write(tmp_path, "0.5.20", "both-reject", AWT)
    loaded = rp.load(path)
    fixed = attrs.evolve(loaded, release=releases.get("0.5.19"))
    # 0.5.19 lets the stub go on: the same steps end where decode still commits
    out = rp.run(fixed)
    assert out.first_disabled_step is not None or not out.violated


def test_a_lasso_is_closed_in_itf_and_marked_in_every_format(tmp_path):
    v = verdict("requeue-forever", "optimistic-tight", NL)
    path = tmp_path / "lasso.itf.json"
    itf.write(path, v.trace, scenario.builtin("optimistic-tight"))
    data = json.loads(path.read_text())
    assert data["loop"] == v.trace.loop
    assert data["states"][data["loop"]]["#meta"]["loop"]
    strip = [{k: x for k, x in st.items() if k != "#meta"} for st in data["states"]]
    assert strip[-1] == strip[data["loop"]]
    meta, steps = itf.read(path)
    assert meta["loop"] == v.trace.loop and len(steps) == len(v.trace)
    # the trace names the mutant, and replays on it
    assert meta["release"] == "requeue-forever" and rp.run(rp.load(path)).violated
    r = run("replay", str(path))
    assert r.returncode == 0 and "a fair cycle that never answers the request" in r.stdout
    # on the real release the cycle does not close: the second requeue is the fallback
    assert not rp.run(rp.load(path, release="0.5.21")).violated
    md = render.to_markdown({"loop": v.trace.loop, "request": 0, "property": NL.name},
                            render.rows(v.trace.steps, v.trace.states, v.trace.events, True))
    assert "↻ loop starts" in md
    mm = render.to_mermaid({"loop": v.trace.loop, "request": 0}, v.trace.steps,
                           v.trace.states, v.trace.events, True)
    assert "loop forever" in mm and mm.count("    end") >= 1
    dot = render.to_dot({"loop": v.trace.loop}, v.trace.steps, v.trace.states, True)
    assert f"s{len(v.trace)} -> s{v.trace.loop} [style=dashed" in dot


def test_a_bad_loop_index_is_one_line(tmp_path):
    path, _ = _write(tmp_path, "0.5.20", "both-reject", AWT)
    data = json.loads(path.read_text())
    data["loop"] = 99
    path.write_text(json.dumps(data))
    r = run("replay", str(path))
    assert r.returncode == 2 and "'loop' must be the index" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


EWB = properties.CATALOG["every-wait-bounded"]


@pytest.mark.parametrize("release", releases.NAMES)
def test_a_dead_transfer_worker_s_wait_ends_by_a_timeout_on_every_release(release):
    """Decode's waiting timeout fails the request and sends prefill the
    room's ABORT, which is what ends prefill's wait: every release holds."""
    assert verdict(release, "transfer-worker-dies-alone", EWB).verdict == "holds"
    assert verdict(release, "transfer-worker-dies-alone", AWT).verdict == "violated"


def test_a_waiting_timeout_that_tells_prefill_nothing_leaves_it_waiting_for_good(tmp_path):
    v = verdict("silent-waiting-timeout", "transfer-worker-dies-alone", EWB)
    assert v.verdict == "violated" and v.trace.rid == 0
    steps = [st.action for st in v.trace.steps]
    assert steps[-3:] == ["d_waiting_timeout", "d_transferred", "xfer_worker_raises"]
    last = v.trace.states[-1]
    ctx = Ctx(mutants.MUTANTS["silent-waiting-timeout"],
              scenario.builtin("transfer-worker-dies-alone"))
    # the deadlock form, which the engines without a graph check, sees it too;
    # answered-without-timeout's deadlock at the real release's timeout is not one
    assert not EWB.partial(ctx, last)
    real = Ctx(releases.get("0.5.20"), scenario.builtin("transfer-worker-dies-alone"))
    waits = verdict("0.5.20", "transfer-worker-dies-alone", AWT).trace.states[-1]
    assert not AWT.partial(real, waits) and EWB.partial(real, waits)
    path = tmp_path / "ewb.itf.json"
    itf.write(path, v.trace, scenario.builtin("transfer-worker-dies-alone"))
    assert json.loads(path.read_text())["#meta"]["waits_at"] == {"prefill": "INFLIGHT",
                                                                 "decode": "GONE"}
    out = rp.run(rp.load(path, release="silent-waiting-timeout"))
    assert out.violated and out.violated_at == 12
    # on the real code the timeout sends the ABORT: prefill can still answer
    out = rp.run(rp.load(path, release="0.5.20"))
    assert out.first_disabled_step is None and not out.violated
    r = run("show", str(path))
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "r0 has a client that waits for good (prefill INFLIGHT, decode GONE)" in text
    assert "no timeout is armed (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT only while" in text


def test_every_timeout_says_when_its_clock_runs():
    timed = [a for a in ACTIONS if a.timeout]
    assert timed and all(a.armed.startswith("while ") for a in timed)
    assert not any(a.armed for a in ACTIONS if not a.timeout)


# ----------------------------------- engines that see no graph: partial forms


@pytest.mark.parametrize("engine", [Z3(depth=10), Hypothesis("dev")], ids=["z3", "hypothesis"])
def test_the_deadlock_form_finds_the_same_hang(engine):
    sc = scenario.builtin("both-reject")
    got = {r.property: r for r in engine.check(releases.get("0.5.20"), sc, [AWT, NL, NSC])}
    assert got[AWT.name].verdict == Answer.VIOLATED and got[AWT.name].trace_length == 9
    assert got[NL.name].verdict == Answer.NOT_CHECKED and "lasso" in got[NL.name].note
    got = {r.property: r for r in engine.check(releases.get("0.5.21"), sc, [AWT])}
    assert got[AWT.name].verdict == Answer.NOT_CHECKED
    assert "deadlock form" in got[AWT.name].note and "exhaustive" in got[AWT.name].note


def test_a_client_abort_that_reached_one_worker_reaches_the_other():
    """The router drops both connections when the client goes: once its abort
    reached one worker, the other's is the deployment's own consequence."""
    ctx = Ctx(releases.get("0.5.21"), scenario.builtin("inflight-reuse"))
    s = next(st for st in verdict("0.5.21", "inflight-reuse",
                                  properties.CATALOG["valid-request-completes"]).trace.states)
    assert not BY_NAME["d_abort"].own(ctx, s, 0)
    aborted = attrs.evolve(s, aborted_by_client=(True, False))
    assert BY_NAME["d_abort"].own(ctx, aborted, 0) and not BY_NAME["d_abort"].own(ctx, aborted, 1)


def test_check_prints_why_a_liveness_cell_is_not_checked(tmp_path):
    r = run("check", "--engine", "z3", "--depth", "4", "--scenario", "both-reject", "--release",
            "0.5.21", "--property", "no-livelock", "--out", str(tmp_path))
    assert r.returncode == 0
    assert "no-livelock: a lasso needs the whole state graph: use the exhaustive engine" in r.stdout
    assert "not checked" in r.stdout and "not checked by" not in r.stdout.split("\n")[0]


def test_every_liveness_property_says_why_other_engines_skip_it():
    for p in properties.LIVENESS:
        assert p.partial_note and p.goal and p.pending


def test_the_waste_figures_read_the_scenarios_timeout_settings():
    from reqmodel.proposals import guard_check
    rel = releases.get("0.5.21")
    sc = attrs.evolve(scenario.builtin("incident"),
                      timeouts=(("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 900.0),))
    assert guard_check.timeout_seconds(rel, sc)["d_waiting_timeout"] == 900
    assert guard_check.measure(rel, sc)["peer_hold_seconds"] == 900
