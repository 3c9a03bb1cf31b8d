"""Liveness on the explored graph: ``always-possibly`` (AG EF), ``bounded``
(AG EF through own steps and timeouts) and ``eventually`` (no fair cycle)
properties, decided on the edges the exhaustive engine records while it
explores, not by a second search.

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
from typing import Dict, List, Optional, Sequence, Set, Tuple

import attrs

from reqmodel.model.actions import (BY_NAME, Ctx, Step, armed_timeouts, enabled, successors,
                                    timeout_armed)


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
    # ``_untimed`` and ``_Own.of`` of the finished graph (keyed by its edge
    # count), shared by the properties that ask
    untimed: Optional[Tuple[int, Tuple[List[int], List[int]]]] = attrs.field(
        default=None, init=False, repr=False)
    own: Optional[Tuple[int, "_Own"]] = attrs.field(default=None, init=False, repr=False)

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


# imported by the first analysis (``_Own.of``, where each analysis starts),
# not with the module: 36 MB (37 to 73 MB) in every process that imports
# it, the exhaustive engine's worker processes included, which never analyse
np = sparse = csgraph = None


def _import_scipy() -> None:
    global np, sparse, csgraph
    if csgraph is None:
        import numpy
        from scipy import sparse as sparse_
        from scipy.sparse import csgraph as csgraph_
        np, sparse, csgraph = numpy, sparse_, csgraph_


# The graph algorithms below that need no particular order (reachability,
# strongly connected components) run in scipy's csgraph, in C, on the edge
# arrays: in Python they were most of the analysis (Tarjan's algorithm and
# the adjacency lists 70 % of optimistic-abort-unit's, notes/performance.md).
# What depends on the order in which edges were found (the breadth-first
# parents of ``_untimed``, the cycle ``_fair_cycle`` walks) stays in Python.
@attrs.frozen(eq=False)
class _Own:
    """The own edges as integer arrays, and their graph (scipy's CSR)."""

    n: int
    src: np.ndarray
    dst: np.ndarray
    inst: np.ndarray
    graph: object

    @staticmethod
    def of(n: int, edges: Edges) -> "_Own":
        if edges.own is not None and edges.own[0] == len(edges.src):
            return edges.own[1]
        _import_scipy()
        # copies: a view would keep the arrays from growing (BufferError)
        own = np.frombuffer(edges.mine, dtype=np.uint8).astype(bool)
        src = np.frombuffer(edges.src, dtype=np.uint32)[own].astype(np.int64)
        dst = np.frombuffer(edges.dst, dtype=np.uint32)[own].astype(np.int64)
        inst = np.frombuffer(edges.inst, dtype=np.uint32)[own].astype(np.int64)
        got = _Own(n, src, dst, inst, _csr(n, src, dst))
        edges.own = (len(edges.src), got)
        return got


def _csr(n: int, src: np.ndarray, dst: np.ndarray):
    return sparse.csr_array((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))


def _reached(n: int, src: np.ndarray, dst: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per state: reachable from some state in ``starts`` along the edges."""
    # one search from an added state n with an edge to each start
    hub = np.full(len(starts), n, dtype=np.int64)
    g = _csr(n + 1, np.concatenate([src, hub]), np.concatenate([dst, starts]))
    out = np.zeros(n + 1, dtype=bool)
    out[csgraph.breadth_first_order(g, n, directed=True, return_predecessors=False)] = True
    return out[:n]


def _components(g) -> np.ndarray:
    """Per state: its strongly connected component's label."""
    return csgraph.connected_components(g, directed=True, connection="strong")[1]


def first_stuck(states: Sequence, edges: Edges, goal, pending) -> Optional[Stuck]:
    """A state in which some request waits for good, reached by a shortest
    path without timeouts: the request cannot reach its goal by own steps,
    and nothing the deployment still does on its own leads out of where it
    is (a bottom component of the own-step graph: a deadlock, or a cycle
    with no exit).  Every state that can no longer reach the goal leads by
    own steps to such a state, so the property fails exactly when a state
    reached without timeouts cannot reach the goal."""
    n = len(states)
    own = _Own.of(n, edges)
    bottom = _bottom(own)
    order, parent = _untimed(n, edges)
    best: Optional[Tuple[int, int]] = None  # (rank, rid)
    for r in range(len(states[0].p)):
        goals = np.fromiter((v for v in range(n) if goal(states[v], r)), dtype=np.int64)
        can = _reached(n, own.dst, own.src, goals)  # backwards from the goal states
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


def _bottom(own: _Own, comp: Optional[np.ndarray] = None) -> np.ndarray:
    """Per state: it lies in a bottom strongly connected component of the
    own-step graph (no own step leads out of the component); ``comp``, the
    components' labels when the caller has them."""
    comp = _components(own.graph) if comp is None else comp
    leaves = np.ones(comp.max() + 1, dtype=bool)
    out = comp[own.src] != comp[own.dst]
    leaves[comp[own.src[out]]] = False
    return leaves[comp]


def first_unbounded(states: Sequence, edges: Edges, goal, pending, armed
                    ) -> Optional[Tuple[int, int]]:
    """The first reachable state (by any steps: timeouts, faults and the
    client's too; the least state id, so a shallowest one) in which some
    request waits and nothing ends its wait: the deployment's own steps
    cannot reach its goal, none leads out of where it is (a bottom component
    of the own-step graph), and no timeout is armed on any state of it
    (``armed(state)``: whether the scenario lets the timeout fire or not,
    :func:`armed_in`).
    A component with no armed timeout has no timeout edge either, so this is
    AG EF goal through own steps and timeouts; a timeout the scenario does
    not explore is taken to end the wait, so the analysis never calls a wait
    unbounded on a timeout it did not follow.  As (state id, request), or
    None."""
    n = len(states)
    own = _Own.of(n, edges)
    comp = _components(own.graph)
    bottom = _bottom(own, comp)
    known: Dict[int, bool] = {}  # per state id: some timeout is armed there
    best: Optional[Tuple[int, int]] = None
    for r in range(len(states[0].p)):
        goals = np.fromiter((v for v in range(n) if goal(states[v], r)), dtype=np.int64)
        cand = np.flatnonzero(~_reached(n, own.dst, own.src, goals) & bottom).tolist()
        if not cand:
            continue
        # a bottom component that cannot reach the goal lies whole in ``cand``
        for v in cand:
            if v not in known:
                known[v] = bool(armed(states[v]))
        ends = np.zeros(int(comp.max()) + 1, dtype=bool)
        np.logical_or.at(ends, comp[cand], np.array([known[v] for v in cand], dtype=bool))
        bad = next((v for v in cand if not ends[comp[v]] and pending(states[v], r)), None)
        if bad is not None and (best is None or bad < best[0]):
            best = (bad, r)
    return best


def armed_in(ctx: Ctx):
    """Per concrete state: some timeout is armed there (``timeout_armed``)."""
    return lambda s: timeout_armed(ctx, s)


def first_lasso(states: Sequence, edges: Edges, pending) -> Optional[Lasso]:
    """A fair cycle of own steps on which some request stays short of its
    goal, entered as early as the graph allows (the least state id of any
    such component)."""
    n = len(states)
    own = _Own.of(n, edges)
    order, parent = _untimed(n, edges)
    rank = np.full(n, n, dtype=np.int64)  # n: not reached without a timeout
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    # the step instances enabled on each state: its own edges' (state, instance) pairs
    width = int(own.inst.max()) + 1 if len(own.inst) else 1
    enabled = np.unique(own.src * width + own.inst)
    best: Optional[Tuple[int, int, np.ndarray]] = None  # (rank of the entry, rid, labels)
    for r in range(len(states[0].p)):
        waits = np.fromiter((bool(pending(s, r)) for s in states), dtype=bool, count=n)
        inside = waits[own.src] & waits[own.dst]
        src, dst, inst = own.src[inside], own.dst[inside], own.inst[inside]
        comp = _components(_csr(n, src, dst)).astype(np.int64)
        size = np.bincount(comp)
        cyclic = size > 1
        cyclic[comp[src[src == dst]]] = True  # a single state with a self-loop
        # a step enabled on every state of a cycle and never taken on it: unfair
        on = enabled // width
        keep = cyclic[comp[on]]
        pairs = comp[on[keep]] * width + enabled[keep] % width
        keys, counts = np.unique(pairs, return_counts=True)
        always = keys[counts == size[keys // width]]
        same = comp[src] == comp[dst]
        taken = np.unique(comp[src[same]] * width + inst[same])
        unfair = np.zeros(len(size), dtype=bool)
        unfair[always[~np.isin(always, taken)] // width] = True
        fair = cyclic & ~unfair
        # entered as early as possible: the least rank among the untimed members
        entry = np.full(len(size), n, dtype=np.int64)
        np.minimum.at(entry, comp, rank)
        entry[~fair] = n
        k = int(entry.min())
        if k < n and (best is None or k < best[0]):
            best = (k, r, comp)
    if best is None:
        return None
    k, r, comp = best
    entry = order[k]
    members = set(np.flatnonzero(comp == comp[entry]).tolist())
    enabled_at: Dict[int, Set[int]] = {v: set() for v in members}
    out = comp[own.src] == comp[entry]  # the own edges out of a member
    for u, i in zip(own.src[out].tolist(), own.inst[out].tolist()):
        enabled_at[u].add(i)
    return Lasso(r, _path_to(entry, parent), _fair_cycle(entry, members, edges, enabled_at))


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
    own = _Own.of(len(states), edges)
    found = set()
    for v in np.flatnonzero(_reached(own.n, own.src, own.dst, np.array([start]))).tolist():
        for a, r in armed_timeouts(ctx, states[v]):
            found.add((a.name, r, a.timeout, ctx.timeout_seconds(a)))
    return tuple(sorted(found, key=lambda t: (t[1] != rid, t[3], t[0], t[1])))


# ------------------------------------------------------- replay on one state


def can_answer(ctx: Ctx, s, rid: int, goal, max_states: int = 200_000,
               timeouts: bool = False) -> Optional[bool]:
    """Whether request ``rid`` can still reach its goal from concrete state
    ``s`` through own steps (a search of its own, without symmetry); None
    when more than ``max_states`` states would have to be visited.  With
    ``timeouts``, a timeout armed on a state own steps reach counts as an end
    of the wait too (as in :func:`first_unbounded`)."""
    seen = {s}
    stack = [s]
    while stack:
        u = stack.pop()
        if goal(u, rid):
            return True
        if timeouts and timeout_armed(ctx, u):
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
