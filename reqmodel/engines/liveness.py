"""Liveness on the explored graph: ``always-possibly`` (AG EF) and
``eventually`` (no fair cycle) properties, decided on the edges the
exhaustive engine records while it explores, not by a second search.

The steps that count are the deployment's own (``Action.own``: not an
environment step, or one that follows from an earlier one): a timeout, a client abort, a transfer failure, a retraction or a pause
is never what answers a request here, since a client that waits for one of
them has waited for a timeout or given up.  Fairness is *weak fairness per
step instance* (an action on one request): a step that stays enabled on every
state of a cycle is taken on it.  notes/liveness.md says why this and not the
coarser "per worker loop" (which admits cycles no SGLang loop runs).

Request identities must be stable along edges for "request r" to mean one
request on a path, so an exploration with graph properties does not permute
requests (pages, slots and ranks still are: no goal reads their names).
"""
from __future__ import annotations

import array
import collections
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import attrs

from reqmodel.model.actions import ACTIONS, BY_NAME, Ctx, Step, enabled, successors


@attrs.define
class Edges:
    """Every explored edge as three integer arrays: source, target and step
    instance (an index into ``instances``: (action name, request))."""

    src: array.array = attrs.field(factory=lambda: array.array("I"))
    dst: array.array = attrs.field(factory=lambda: array.array("I"))
    inst: array.array = attrs.field(factory=lambda: array.array("I"))
    mine: bytearray = attrs.field(factory=bytearray)  # per edge: a step of the deployment's own
    instances: List[Tuple[str, int]] = attrs.field(factory=list)
    ids: Dict[Tuple[str, int], int] = attrs.field(factory=dict)
    # ``_untimed`` of the finished graph, shared by the properties that ask
    untimed: Optional[Tuple[int, Tuple[List[int], List[int]]]] = attrs.field(
        default=None, init=False, repr=False)

    def add(self, u: int, v: int, step: Step, own: bool) -> None:
        self.add_instance(u, v, (step.action, step.rid), own)

    def add_instance(self, u: int, v: int, key: Tuple[str, int], own: bool) -> None:
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.instances)
            self.instances.append(key)
        self.src.append(u)
        self.dst.append(v)
        self.inst.append(i)
        self.mine.append(own)


@attrs.frozen
class Stuck:
    """A state in which request ``rid`` waits for good, and a shortest path
    to it (state ids from the initial state)."""

    rid: int
    path: Tuple[int, ...]


@attrs.frozen
class Lasso:
    """A shortest path to ``path[-1]`` and a fair cycle through it (state
    ids) that leaves request ``rid`` unanswered."""

    rid: int
    path: Tuple[int, ...]
    cycle: Tuple[int, ...]  # states after the entry, ending at the entry again


def _untimed(n: int, edges: Edges) -> Tuple[List[int], List[int]]:
    """Breadth-first order and parents of the states reached without any
    timeout.  A timeout fires only after minutes without progress, so a
    state reached through one is already a client's wait; the properties
    ask about the states before any."""
    if edges.untimed is not None and edges.untimed[0] == len(edges.src):
        return edges.untimed[1]
    timed = [BY_NAME[name].timeout is not None for name, _ in edges.instances]
    adj: List[List[int]] = [[] for _ in range(n)]
    for u, v, i in zip(edges.src, edges.dst, edges.inst):
        if not timed[i]:
            adj[u].append(v)
    parent = [-2] * n
    parent[0] = -1
    order = [0]
    for u in order:
        for v in adj[u]:
            if parent[v] == -2:
                parent[v] = u
                order.append(v)
    edges.untimed = (len(edges.src), (order, parent))
    return order, parent


def _path_to(v: int, parent: List[int]) -> Tuple[int, ...]:
    out = []
    while v != -1:
        out.append(v)
        v = parent[v]
    return tuple(out[::-1])


def _adjacency(n: int, edges: Edges, keep, reverse: bool = False) -> List[List[int]]:
    """Successor (or, ``reverse``, predecessor) lists over own edges."""
    adj: List[List[int]] = [[] for _ in range(n)]
    a, b = (edges.dst, edges.src) if reverse else (edges.src, edges.dst)
    for u, v, own in zip(a, b, edges.mine):
        if own and keep(u, v):
            adj[u].append(v)
    return adj


def first_stuck(states: Sequence, edges: Edges, goal, pending) -> Optional[Stuck]:
    """A state in which some request waits for good, reached by a shortest
    path without timeouts: the request cannot reach its goal by own steps,
    and nothing the deployment still does on its own leads out of where it
    is (a bottom component of the own-step graph: a deadlock, or a cycle
    with no exit).  Every state that can no longer reach the goal leads by
    own steps to such a state, so the property fails exactly when a state
    reached without timeouts cannot reach the goal."""
    n = len(states)
    radj = _adjacency(n, edges, lambda u, v: True, reverse=True)
    bottom = _bottom(n, edges)
    order, parent = _untimed(n, edges)
    best: Optional[Tuple[int, int]] = None  # (rank, rid)
    for r in range(len(states[0].p)):
        can = bytearray(n)
        stack = [v for v in range(n) if goal(states[v], r)]
        for v in stack:
            can[v] = 1
        while stack:
            v = stack.pop()
            for u in radj[v]:
                if not can[u]:
                    can[u] = 1
                    stack.append(u)
        if all(can[v] or not pending(states[v], r) for v in order):
            continue
        # the shallowest waiting state: own steps are never timeouts, so the
        # bottom states an untimed state leads to are untimed too (and keep
        # the request waiting: it has arrived and cannot reach its goal)
        bad = next(k for k, v in enumerate(order)
                   if not can[v] and bottom[v] and pending(states[v], r))
        if best is None or bad < best[0]:
            best = (bad, r)
    if best is None:
        return None
    return Stuck(best[1], _path_to(order[best[0]], parent))


def _bottom(n: int, edges: Edges) -> bytearray:
    """Per state: it lies in a bottom strongly connected component of the
    own-step graph (no own step leads out of the component)."""
    adj = _adjacency(n, edges, lambda u, v: True)
    comp = [0] * n
    sccs = _sccs(range(n), adj)
    for k, members in enumerate(sccs):
        for v in members:
            comp[v] = k
    leaves = bytearray(b"\x01") * len(sccs)
    for u in range(n):
        for v in adj[u]:
            if comp[v] != comp[u]:
                leaves[comp[u]] = 0
    return bytearray(leaves[comp[v]] for v in range(n))


def _sccs(nodes: Iterable[int], adj: List[List[int]]) -> List[List[int]]:
    """Tarjan's strongly connected components, iterative."""
    index: Dict[int, int] = {}
    low: Dict[int, int] = {}
    on: Set[int] = set()
    stack: List[int] = []
    out: List[List[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, i = work[-1]
            if i < len(adj[v]):
                work[-1] = (v, i + 1)
                w = adj[v][i]
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def first_lasso(states: Sequence, edges: Edges, pending) -> Optional[Lasso]:
    """A fair cycle of own steps on which some request stays short of its
    goal, entered as early as the graph allows (the least state id of any
    such component)."""
    n = len(states)
    enabled_at: List[Set[int]] = [set() for _ in range(n)]
    for u, i, own in zip(edges.src, edges.inst, edges.mine):
        if own:
            enabled_at[u].add(i)
    best: Optional[Lasso] = None
    order, parent = _untimed(n, edges)
    rank = {v: k for k, v in enumerate(order)}
    for r in range(len(states[0].p)):
        waits = [pending(s, r) for s in states]
        adj = _adjacency(n, edges, lambda u, v: waits[u] and waits[v])
        for comp in _sccs((v for v in range(n) if waits[v]), adj):
            members = set(comp)
            if len(comp) == 1 and comp[0] not in adj[comp[0]]:
                continue  # a single state without a self-loop is no cycle
            taken = {i for u, v, i, own in zip(edges.src, edges.dst, edges.inst, edges.mine)
                     if own and u in members and v in members}
            always = set.intersection(*(enabled_at[v] for v in comp))
            if always - taken:
                continue  # a step enabled throughout is never taken: unfair
            entries = [v for v in comp if parent[v] != -2]
            if not entries:
                continue  # entered only through a timeout
            entry = min(entries, key=rank.__getitem__)
            if best is None or rank[entry] < rank[best.path[-1]]:
                best = Lasso(r, _path_to(entry, parent),
                             _fair_cycle(entry, members, edges, enabled_at))
    return best


def _bfs_path(src: int, targets, members: Set[int], adj) -> List[int]:
    """The states after ``src`` on a shortest path inside ``members`` to a
    target (``src`` itself counts as a target only when the path returns)."""
    prev: Dict[int, int] = {}
    seen = {src}
    q = collections.deque([src])
    while q:
        u = q.popleft()
        for v in adj[u]:
            if v not in members:
                continue
            if targets(v):
                path, x = [v], u
                while x != src:
                    path.append(x)
                    x = prev[x]
                return path[::-1]
            if v not in seen:
                seen.add(v)
                prev[v] = u
                q.append(v)
    raise RuntimeError("no path inside a strongly connected component")  # pragma: no cover


def _fair_cycle(entry: int, members: Set[int], edges: Edges, enabled_at) -> Tuple[int, ...]:
    """A cycle through ``entry`` inside the component that is fair: start from
    a shortest cycle and, while some step is enabled on every state of it and
    not taken, detour through an edge of that step (or a state where it is
    disabled).  Detours only add states and edges, so this ends."""
    adj: Dict[int, List[Tuple[int, int]]] = collections.defaultdict(list)
    for u, v, i, own in zip(edges.src, edges.dst, edges.inst, edges.mine):
        if own and u in members and v in members:
            adj[u].append((v, i))
    plain = collections.defaultdict(list)
    for u, outs in adj.items():
        plain[u] = [v for v, _ in outs]
    cycle = _bfs_path(entry, lambda v: v == entry, members, plain)
    while True:
        walk = [entry] + cycle
        taken = set()
        for a, b in zip(walk, walk[1:]):
            taken |= {i for v, i in adj[a] if v == b}
        always = set.intersection(*(enabled_at[v] for v in walk))
        missing = sorted(always - taken)
        if not missing:
            return tuple(cycle)
        i = missing[0]
        source = next((u for u in sorted(members) if any(j == i for _, j in adj[u])), None)
        if source is not None:
            to_src = [] if source == entry else _bfs_path(entry, lambda v: v == source, members, plain)
            target = next(v for v, j in adj[source] if j == i)
            back = [] if target == entry else _bfs_path(target, lambda v: v == entry, members, plain)
            detour = to_src + [target] + back
            if target == entry:
                detour = to_src + [entry]
        else:
            off = next(v for v in sorted(members) if i not in enabled_at[v])
            to_off = _bfs_path(entry, lambda v: v == off, members, plain)
            detour = to_off + _bfs_path(off, lambda v: v == entry, members, plain)
        cycle = cycle + detour


def ends_by(ctx: Ctx, states: Sequence, edges: Edges, start: int, rid: int
            ) -> Tuple[Tuple[str, int, str, float], ...]:
    """The timeouts that can end the wait of a stuck request: every timeout
    action (with its scenario flag set or not) whose guard holds on some state
    the deployment's own steps still reach from ``start``; as (action,
    request, environment variable, default seconds), the request's own first."""
    adj = _adjacency(len(states), edges, lambda u, v: True)
    seen = {start}
    stack = [start]
    while stack:
        u = stack.pop()
        for v in adj[u]:
            if v not in seen:
                seen.add(v)
                stack.append(v)
    found = set()
    for v in seen:
        s = states[v]
        if s.crashed():  # nothing moves after a crash
            continue
        for a in ACTIONS:
            if a.timeout is None:
                continue
            for r in range(len(s.p)):
                if a.guard(ctx, s, r):
                    found.add((a.name, r, a.timeout, ctx.timeout_seconds(a)))
    return tuple(sorted(found, key=lambda t: (t[1] != rid, t[3], t[0], t[1])))


# ------------------------------------------------------- replay on one state


def can_answer(ctx: Ctx, s, rid: int, goal, max_states: int = 200_000) -> Optional[bool]:
    """Whether request ``rid`` can still reach its goal from concrete state
    ``s`` through own steps (a search of its own, without symmetry); None
    when more than ``max_states`` states would have to be visited."""
    seen = {s}
    stack = [s]
    while stack:
        u = stack.pop()
        if goal(u, rid):
            return True
        for step, v, _ in successors(ctx, u):
            if not BY_NAME[step.action].own(ctx, u, step.rid) or v in seen:
                continue
            if len(seen) >= max_states:
                return None
            seen.add(v)
            stack.append(v)
    return False


def cycle_is_fair(ctx: Ctx, states: Sequence, steps: Sequence[Step]) -> bool:
    """Concrete states ``states[0..k]`` with ``states[k] == states[0]`` joined
    by ``steps``: every own step instance enabled on all of them is taken."""
    if not steps or states[-1] != states[0]:
        return False
    if not all(BY_NAME[st.action].own(ctx, s, st.rid) for st, s in zip(steps, states)):
        return False
    taken = {(st.action, st.rid) for st in steps}
    always = None
    for s in states[:-1]:
        here = {(a.name, r) for a, r in enabled(ctx, s) if a.own(ctx, s, r)}
        always = here if always is None else always & here
    return not (always - taken)
