"""Bounded model checking with Z3 over the learned paths of the actions.

The transition relation is the set of clauses ``reqmodel.symexec`` learns by
running the actions on slot vectors.  Unrolled ``k`` times it is a Z3
formula: at step ``t`` a selector picks one clause, the clause's condition
holds on state ``t-1`` and its effect gives state ``t`` (slots it does not
write keep their value).  Clauses are learned lazily, and the engine only
trusts an answer at depth ``k`` once Z3 has shown the learned relation
*complete* up to it: no sequence of ``k-1`` learned steps reaches a state in
which some action instance takes a path not learned yet.  Each time Z3 finds
one, the engine replays the sequence on the explicit model and learns every
action instance's path at every state on it; the replay is exact because
every learned clause is a path of the real action code.

A satisfying model of "the property breaks at step ``k``" is decoded into
steps and confirmed by replaying them on the explicit model.  Depths are
tried in increasing order, so the first violation found is a shortest one,
the same length the breadth-first explorer reports.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import attrs
import z3

from reqmodel.engines.z3 import action_paths as sx
from reqmodel.model.actions import Ctx, apply, initial_state
from reqmodel.engines.exhaustive import Trace
from reqmodel.model.properties import Property
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.properties import Kind


W = 16  # bits of a slot's value code and of a step's clause selector


_VALS: Dict[int, Any] = {}


def _val(c: int):
    v = _VALS.get(c)
    if v is None:
        v = _VALS[c] = z3.BitVecVal(c, W)
    return v


class TooManyPaths(ValueError):
    """More learned paths than a step's selector can name (one line for the user)."""


class Unconfirmed(RuntimeError):
    """Z3 returned a trace the explicit model does not replay (an engine bug)."""


@attrs.define
class Result:
    property: str
    verdict: str  # violated | holds-to-depth | proved; reached | unreached-to-depth | unreachable
    depth: int  # violation (reach) depth; the depth searched; for a proof, the
    # depth at which no simple path was left
    trace: Optional[Trace]
    seconds: float
    clauses: int
    refinements: int


class Relation:
    """The clauses learned so far, by action instance and path condition."""

    def __init__(self, lay: sx.Layout, props: Sequence[Property]):
        self.lay = lay
        self.props = tuple(props)
        self.paths: Dict[Tuple[str, int], Dict[Tuple, List[sx.Clause]]] = collections.defaultdict(dict)
        self.enabled: List[sx.Clause] = []
        self.seen = set()  # slot-value tuples of states learned at
        self.codes: Dict[Any, Dict[Any, int]] = collections.defaultdict(dict)
        self.insts = sx.instances(lay.ctx)
        # state predicates: property name -> {path condition: result}
        self.preds: Dict[str, Dict[Tuple, bool]] = {p.name: {} for p in self.props if p.state}
        self.pred_fn = {p.name: p.state for p in self.props if p.state}

    def code(self, key, value) -> int:
        table = self.codes[sx._fclass(key)]
        c = table.get(value)
        if c is None:
            c = table[value] = len(table)
        return c

    def learn_at(self, values: Dict[Any, Any]) -> int:
        """Learn every action instance's path at one state; returns new clauses."""
        sig = tuple(values[k] for k in self.lay.keys)
        if sig in self.seen:
            return 0
        self.seen.add(sig)
        for name, known in self.preds.items():
            if not any(sx.satisfied(cond, values) for cond in known):
                cond, result = sx.learn_predicate(self.lay, values, self.pred_fn[name])
                known[cond] = result
        new = 0
        for a, r in self.insts:
            known = self.paths[(a.name, r)]
            if any(sx.satisfied(cond, values) for cond in known):
                continue
            cls = sx.learn(self.lay, values, a, r, self.props)
            known[cls[0].cond] = cls
            for c in cls:
                if c.arg is not None:
                    self.enabled.append(c)
                    new += 1
        return new


class Unrolling:
    """The relation unrolled from the initial state over ``depth`` steps."""

    def __init__(self, rel: Relation, s0: Dict[Any, Any], depth: int = 0):
        self.rel = rel
        self.x = [{k: _val(rel.code(k, s0[k])) for k in rel.lay.keys}]
        self.sel = []
        self.built = len(rel.enabled)  # clauses the steps choose from
        self._conds: Dict[Any, Any] = {}
        self.picks: List[List[Any]] = []  # per step, "the step takes clause i"
        self._distinct: List[Any] = []  # per state j >= 1: it differs from every earlier one
        self.solver = z3.SolverFor("QF_BV")
        self.writers = collections.defaultdict(list)
        for i, c in enumerate(rel.enabled):
            for k, eff in c.effect:
                self.writers[k].append((i, eff))
        for _ in range(depth):
            self.extend()

    @property
    def depth(self) -> int:
        return len(self.sel)

    def extend(self) -> None:
        """One more step: a learned clause whose condition holds takes it."""
        rel = self.rel
        pre = self.x[-1]
        t = len(self.x)
        sel = z3.BitVec(f"sel{t}", W)
        self.sel.append(sel)
        if len(rel.enabled) >= 1 << W:
            raise TooManyPaths(f"more than {(1 << W) - 1:,} learned paths of the actions: "
                               "lower --depth or check a smaller scenario")
        self.solver.add(z3.ULT(sel, len(rel.enabled)))
        picks = [sel == i for i in range(len(rel.enabled))]
        self.picks.append(picks)
        for i, c in enumerate(rel.enabled):
            self.solver.add(z3.Implies(picks[i], self.cond(pre, c.cond)))
        nxt = {}
        for k in rel.lay.keys:
            ws = self.writers.get(k)
            if not ws:
                nxt[k] = pre[k]
                continue
            v = z3.BitVec(f"x{t}_{k}", W)
            e = pre[k]
            for i, (kind, val) in ws:
                e = z3.If(picks[i], _val(rel.code(k, val)) if kind == "const" else pre[val], e)
            self.solver.add(v == e)
            nxt[k] = v
        self.x.append(nxt)

    def cond(self, x, cond) -> z3.BoolRef:
        """The path condition on a state of the unrolling (built once per
        state and path: building Z3 terms is most of the engine's time)."""
        key = (id(x), cond)
        f = self._conds.get(key)
        if f is None:
            f = self._conds[key] = z3.And([x[k] == _val(self.rel.code(k, v)) for k, v in cond])
        return f

    def hit(self, t: int, prop: Property) -> z3.BoolRef:
        """Step ``t`` breaks the safety property (its transition, or the state it
        leads to), or leads to the reachability property's good state."""
        out = []
        if prop.transition:
            # the clauses step t chooses from (the relation may have grown
            # since, by paths out of states deeper than t)
            picks = self.picks[t - 1]
            out += [pick for pick, c in zip(picks, self.rel.enabled) if prop.name in c.broken]
        if prop.state:
            want = prop.kind == Kind.SOMETIMES
            out += [self.cond(self.x[t], cond)
                    for cond, good in self.rel.preds[prop.name].items() if good == want]
        return z3.Or(out or [False])

    def loop_free(self) -> z3.BoolRef:
        """The states of the unrolling are pairwise different: the path is
        simple."""
        # only slots some step writes can tell two states apart; the pairs of
        # earlier depths are kept (each depth adds the pairs with its state)
        xs, keys = self.x, [k for k in self.rel.lay.keys if k in self.writers]
        while len(self._distinct) < len(xs) - 1:
            j = len(self._distinct) + 1
            self._distinct.append(z3.And([z3.Or([xs[i][k] != xs[j][k] for k in keys] or [False])
                                          for i in range(j)]))
        return z3.And(self._distinct)

    def steps(self, model, upto: int):
        return [self.rel.enabled[model.eval(s, model_completion=True).as_long()] for s in self.sel[:upto]]


def _replay(ctx: Ctx, clauses) -> Tuple[list, list, list]:
    s = initial_state(ctx.scenario)
    states, steps, events = [s], [], []
    for c in clauses:
        out = apply(ctx, s, c.step)
        if out is None:
            raise Unconfirmed(f"{c.step} is not enabled where Z3 took it")
        s, evs = out
        states.append(s)
        steps.append(c.step)
        events.append(evs)
    return states, steps, events


def _complete(ctx: Ctx, rel: Relation, u: Unrolling, t: int, actions: bool = True,
              batch: int = 50) -> int:
    """Ask Z3 for states ``t`` learned steps away on which some action instance
    takes a path not learned yet, and learn every instance's path on each
    state of each sequence found.  Within one call the unrolling's steps are
    the relation as it was built; a path learned meanwhile is ruled out of the
    question at once, so one unrolling answers up to ``batch`` times.
    Returns how many sequences were found (0: complete at ``t``)."""
    s = u.solver
    x = u.x[t]
    s.push()
    flags = {}
    known = dict(rel.preds)
    if actions:
        known.update(rel.paths)
    for key, paths in known.items():
        f = flags[key] = z3.Bool(f"uncovered_{key}")
        for cond in paths:
            s.add(z3.Implies(f, z3.Not(u.cond(x, cond))))
    s.add(z3.Or(list(flags.values()) or [False]))
    found = 0
    try:
        while found < batch and s.check() == z3.sat:
            found += 1
            states, _, _ = _replay(ctx, u.steps(s.model(), t))
            before = {key: len(p) for key, p in known.items()}
            for st in states:
                rel.learn_at(rel.lay.values(st))
            for key in flags:
                paths = rel.preds[key] if key in rel.preds else rel.paths[key]
                for cond in list(paths)[before.get(key, 0):]:
                    s.add(z3.Implies(flags[key], z3.Not(u.cond(x, cond))))
    finally:
        s.pop()
    return found


def _trace(release, scenario, prop, clauses, ctx) -> Trace:
    """Z3's steps, replayed on the explicit model; the step must break (or
    reach) the property there too."""
    states, steps, events = _replay(ctx, clauses)
    if not prop.hit(states[-2], steps[-1], events[-1], states[-1]):
        raise Unconfirmed(f"the explicit model does not {'reach' if prop.kind == 'sometimes' else 'break'} "
                          f"{prop.name} on Z3's trace")
    kind = ("reached" if prop.kind == Kind.SOMETIMES
            else "state" if not prop.holds_in(states[-1]) else "transition")
    return Trace(release.name, scenario.name, prop.name, tuple(steps), tuple(states),
                 tuple(events), kind)


def run(release: Release, scenario: Scenario, props: Sequence[Property], depth: int,
        max_net: int = 8, log=None, seconds: Optional[float] = None) -> Dict[str, Result]:
    """Search, depth by depth, for the shortest violation of each safety
    property and the shortest path to each reachability property's good
    state, up to ``depth`` steps (or until ``seconds`` have passed at the end
    of a depth).  The properties share one learned relation and one
    unrolling. ``log(k, refinements, learned paths, answered)`` is called as
    depth ``k`` is learned and when it is searched.

    After each depth ``k`` the engine also asks for a *simple* path of ``k``
    steps (no state twice).  When there is none, every reachable state is
    reachable in fewer than ``k`` steps (the recurrence diameter is below
    ``k``: Kroening and Strichman's completeness threshold), every step out
    of them has been searched, and what was not found does not exist: the
    open safety properties are ``proved`` and the open reachability
    properties ``unreachable``."""
    t0 = time.time()
    ctx = Ctx(release, scenario)
    lay = sx.Layout.of(ctx, max_net)
    rel = Relation(lay, props)
    s0 = initial_state(scenario)
    v0 = lay.values(s0)
    rel.learn_at(v0)
    refinements = 0
    results: Dict[str, Result] = {}

    def done(p, verdict, k, trace=None):
        results[p.name] = Result(p.name, verdict, k, trace, time.time() - t0, len(rel.enabled),
                                 refinements)

    for p in props:
        if p.kind == Kind.ALWAYS and not p.holds_in(s0):
            done(p, "violated", 0, Trace(release.name, scenario.name, p.name, (), (s0,), (), "state"))
    u = Unrolling(rel, v0)
    searched = 0
    for k in range(1, depth + 1):
        pending = [p for p in props if p.name not in results]
        if not pending:
            break
        # the learned relation must be complete on every state k-1 steps away
        while True:
            learned = _complete(ctx, rel, u, k - 1)
            if not learned and u.built == len(rel.enabled):
                break
            refinements += learned
            u = Unrolling(rel, v0, k - 1)
            if log:
                log(k, refinements, len(rel.enabled), len(results))
        u.extend()
        # ... and the state predicates on every state k steps away (what this
        # learns at those states are paths out of them: the steps up to k stand)
        while _complete(ctx, rel, u, k, actions=False):
            refinements += 1
        # one question for all the properties still open (one unsat answer
        # when none breaks at k), then one per property the model shows
        hits = {p.name: u.hit(k, p) for p in pending}
        while hits:
            u.solver.push()
            u.solver.add(z3.Or(list(hits.values())))
            model = u.solver.model() if u.solver.check() == z3.sat else None
            u.solver.pop()
            if model is None:
                break
            clauses = u.steps(model, k)
            for p in pending:
                if p.name in hits and z3.is_true(model.eval(hits[p.name], model_completion=True)):
                    done(p, "reached" if p.kind == Kind.SOMETIMES else "violated", k,
                         _trace(release, scenario, p, clauses, ctx))
                    del hits[p.name]
        if any(p.name not in results for p in props):
            u.solver.push()
            u.solver.add(u.loop_free())
            simple = u.solver.check() == z3.sat
            u.solver.pop()
            if not simple:
                for p in props:
                    if p.name not in results:
                        done(p, "unreachable" if p.kind == Kind.SOMETIMES else "proved", k)
        if log:
            log(k, refinements, len(rel.enabled), len(results))
        searched = k
        if seconds is not None and time.time() - t0 > seconds:
            break
    for p in props:
        if p.name not in results:
            done(p, "unreached-to-depth" if p.kind == Kind.SOMETIMES else "holds-to-depth", searched)
    return results


def check(release: Release, scenario: Scenario, prop: Property, depth: int,
          max_net: int = 8, log=None) -> Result:
    """``run`` for one property."""
    return run(release, scenario, [prop], depth, max_net, log)[prop.name]
