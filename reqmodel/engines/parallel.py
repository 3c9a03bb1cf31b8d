"""Exhaustive search over worker processes, with the sequential engine's answer.

The search is breadth first and level-synchronous.  Each worker owns one
shard of the visited set: the canonical states whose hash falls in it.  In a
round every worker expands its part of the level in state-id order and sends
each successor, as it is, to the shard its own hash names (were it a stored
representative, that shard would hold it, so the sequential engine's
look-up-before-canonicalising still applies); there a successor not stored
is canonicalised and its form sent on to the shard that owns the form, which
keeps the forms it has not stored.  A successor is tagged with where the
sequential engine (``exhaustive.explore``) would first meet it: its parent's
id and its place among the parent's successors.  The coordinator merges the
owners' sorted tags, so new states get the ids, and the parents, that the
sequential engine gives them; every trace is therefore the sequential one,
step for step.  With ``stop_early`` the sequential engine stops after the
state whose expansion gave the last missing verdict; the coordinator works
that state out from the tags and cuts states, edges, depth, fired actions
and emitted events there, so the whole ``Exploration`` is the sequential one
(tests/test_parallel.py compares them field by field).

The search starts as the sequential engine, in one process, and hands over
(``Prefix``, ``resume``) at the first level that holds ``FORK_AT`` states:
the workers are forked then and keep their shard of the inherited visited
set, so a small search never pays for processes.  They are forked, not
spawned: they share the interpreter's hash seed, so every process maps a
state to the same shard.

States cross between workers as integer tuples over per-channel tables of
fields and records (``_Codec``).  Each round has two messages per worker to
the coordinator; at the end the coordinator takes the states it needs: those
on the counterexample paths, or every state when a graph property (liveness)
or the caller needs them.  Measured in notes/performance.md.
"""
from __future__ import annotations

import bisect
import heapq
import multiprocessing
import operator
import os
import time
import traceback

from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import attrs

from reqmodel import usercode
from reqmodel.engines import exhaustive, liveness
from reqmodel.engines.exhaustive import (BoundExceeded, Checks, Exploration, _Interner, _path,
                                         verdicts_of)
from reqmodel.model.actions import BY_NAME, Ctx, successors
from reqmodel.model.properties import Property
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import (_HASH_CACHE, DecodeReq, DRoom, MetaSlot, Msg, Page, PrefillReq,
                                  Room, State)

FORK_AT = 500  # states in a level before the workers are forked
_J = 1 << 20  # a tag is parent * _J + the successor's place among its parent's


def workers_from_env() -> int:
    """``$REQMODEL_WORKERS`` when set, else every core this process may run
    on (a search whose levels stay small never forks, so this costs the
    small scenarios nothing; notes/performance.md)."""
    got = os.environ.get("REQMODEL_WORKERS", "").strip()
    if got:
        if not got.isdigit() or int(got) < 1:
            raise ValueError(f"REQMODEL_WORKERS={got!r}: expected a whole number of at least 1")
        return int(got)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _Shard:
    """The states one process owns (``place(state) % n == k``; ``place`` is
    ``hash``, the same in forked processes, or a key that is the same in
    any process, ``raycluster.StableKey``), its part of
    the frontier, and what it has seen on the steps it expanded: first hits
    keyed by tag, the first parent at which each action fired and each event
    kind was emitted, successor counts, and (for liveness) edges."""

    def __init__(self, ctx: Ctx, checks: Checks, canon, want_edges: bool) -> None:
        self.ctx, self.checks, self.canon = ctx, checks, canon
        self.place = hash
        self.intern = _Interner()
        self.k, self.n = 0, 1
        self.ids: Dict[State, int] = {}
        self.frontier: List[Tuple[int, State]] = []
        self.want_edges = want_edges
        self.new: List[Tuple[int, State]] = []  # (tag, state) waiting for ids
        self.late: List[Tuple[int, State, Tuple[str, int], bool]] = []  # edges to new states
        self.reset()

    def reset(self) -> None:
        """Forget what was seen (the coordinator keeps what it saw before the fork)."""
        self.found: Dict[str, Tuple[int, tuple]] = {}  # name -> (tag, hit)
        self.fired: Dict[str, int] = {}  # action -> first parent
        self.emitted: Dict[str, int] = {}
        self.counts: List[Tuple[int, int]] = []  # (parent, successors)
        self.edges: List[Tuple[int, int, Tuple[str, int], bool]] = []  # (tag, target, inst, own)
        # (tag, first tag, inst, own): an edge to the successor this shard
        # sent first this round under ``first tag``, whose target it shares
        self.aliases: List[Tuple[int, int, Tuple[str, int], bool]] = []

    def keep_part(self, k: int, n: int) -> None:
        """After the fork: keep this shard's part of the visited states and frontier."""
        self.k, self.n = k, n
        place = self.place
        self.ids = {s: v for s, v in self.ids.items() if place(s) % n == k}
        self.frontier = [(v, s) for v, s in self.frontier if place(s) % n == k]
        self.reset()

    def add(self, tag: int, v: int, s: State) -> None:
        """A new state and its id: store it and check the state properties."""
        self.ids[s] = v
        self.frontier.append((v, s))
        for name, kind in self.checks.on_state(s, self.found):
            self.found[name] = (tag, (kind, v))

    def expand(self) -> List[list]:
        """Every step out of the frontier.  Each successor goes to the shard
        its own hash names (``out[shard]`` lists (state, tag, inst, own)):
        were it a stored representative, that shard would hold it, so the
        shard can skip its canonical form (``forms``) as the sequential
        engine does."""
        ctx, checks, found, n, place = self.ctx, self.checks, self.found, self.n, self.place
        want, fired, emitted = self.want_edges, self.fired, self.emitted
        out: List[list] = [[] for _ in range(n)]
        frontier, self.frontier = self.frontier, []
        # a successor this shard has already sent this round is not sent
        # again: its first sending has the least tag of the two, and the
        # owner keeps only the least (``resolve``); the edge of a repeat, if
        # edges are wanted, is an alias of the first's (its target is the
        # first's, known once the owner has resolved it: ``resume``)
        sent: Dict[State, int] = {}
        aliases = self.aliases
        for u, s in frontier:
            j = 0
            for j, (step, nxt, evs) in enumerate(successors(ctx, s), 1):
                tag = u * _J + j - 1
                if step.action not in fired:
                    fired[step.action] = u
                for e in evs:
                    if e.kind not in emitted:
                        emitted[e.kind] = u
                for name in checks.on_step(s, step, evs, nxt, found):
                    found[name] = (tag, ("transition", u, step))
                first = sent.get(nxt)
                if first is not None and not want:
                    continue
                inst, own = ((step.action, step.rid), BY_NAME[step.action].own(ctx, s, step.rid)) \
                    if want else (None, False)
                if first is None:
                    sent[nxt] = tag
                    out[place(nxt) % n].append((nxt, tag, inst, own))
                else:
                    aliases.append((tag, first, inst, own))
            if j >= _J:  # pragma: no cover - a million successors of one state
                raise RuntimeError("a state with more than a million successors")
            self.counts.append((u, j))
        return out

    def forms(self, batches: Iterable[list]) -> List[list]:
        """The canonical form of each successor that is not a stored
        representative here, sent on to the shard that owns the form
        (``out[owner]``); an edge to a stored state is recorded at once.
        A round remembers the forms it computed (the sequential engine would
        have stored the state at first sight; here that waits for the
        round's end), and a form is its own form."""
        ids, canon, n, k, want = self.ids, self.canon, self.n, self.k, self.want_edges
        place = self.place
        out: List[list] = [[] for _ in range(n)]
        forms: Dict[State, State] = {}
        for batch in batches:
            for nxt, tag, inst, own in batch:
                v = ids.get(nxt)
                if v is None:
                    c = forms.get(nxt)
                    if c is None:
                        c = forms[nxt] = canon(nxt)
                        forms[c] = c
                    owner = place(c) % n
                    v = ids.get(c) if owner == k else None
                    if v is None:
                        out[owner].append((c, tag, inst, own))
                        continue
                if want:
                    self.edges.append((tag, v, inst, own))
        return out

    def resolve(self, batches: Iterable[list]) -> List[int]:
        """Keep the successors not seen before, each with its least tag (where
        the sequential engine first meets it); their tags, sorted."""
        ids, first, late = self.ids, {}, []
        for batch in batches:
            for c, tag, inst, own in batch:
                v = ids.get(c)
                if v is not None:
                    if self.want_edges:
                        self.edges.append((tag, v, inst, own))
                    continue
                t = first.get(c)
                if t is None or tag < t:
                    first[c] = tag
                if self.want_edges:
                    late.append((tag, c, inst, own))
        self.new = sorted(((t, c) for c, t in first.items()), key=lambda x: x[0])
        self.late = late
        return [t for t, _ in self.new]

    def assign(self, vids: Sequence[int]) -> None:
        """Store the new states under the ids the coordinator gave them."""
        intern = self.intern
        got = {}
        for (tag, c), v in zip(self.new, vids):
            c = intern(c)
            got[c] = v
            self.add(tag, v, c)
        for tag, c, inst, own in self.late:
            self.edges.append((tag, got[c], inst, own))
        self.new, self.late = [], []

    def result(self) -> tuple:
        return self.found, self.fired, self.emitted, self.counts, self.edges, self.aliases

    def states(self, wanted: Optional[set]) -> List[Tuple[int, State]]:
        return [(v, s) for s, v in self.ids.items() if wanted is None or v in wanted]


_FIELDS = tuple(f.name for f in attrs.fields(State))
_GET_FIELDS = operator.attrgetter(*_FIELDS)
_RECORDS = frozenset({PrefillReq, DecodeReq, Room, DRoom, Page, MetaSlot, Msg})
_set_hash = State.__dict__[_HASH_CACHE].__set__  # attrs' cache_hash slot


class _Codec:
    """States on one channel between two shards as tuples of small integers.
    A state's fields (tuples of records) and the records in them are each
    sent once, then named by their place in the channel's tables: a
    successor shares most of its fields with its parent, and pickling a
    record costs far more than an integer."""

    def __init__(self, interned: Optional[Dict[object, object]] = None,
                 hashes: bool = False) -> None:
        # sending end: per field, its values' places; the parts' places
        self.fields: Tuple[Dict[tuple, int], ...] = tuple({} for _ in _FIELDS)
        self.placed = 0  # field values placed so far (the receiver's table size)
        self.parts: Dict[Tuple[type, object], int] = {}
        self.field_table: List[tuple] = []  # receiving end
        self.part_table: List[object] = []
        # the receiving shard's interned values (``_Interner.table``): a
        # received record that the shard holds already is taken as that very
        # object, so comparing a received state with a stored one mostly
        # meets the same objects (tuple equality tests identity first), and
        # memory is shared.  Only records: ``0 == False``, and a field of
        # bools must not come back as one of ints
        self.interned = {} if interned is None else interned
        # forked processes share ``hash``: a state's hash, computed by its
        # sender to place it, goes along and is not computed again
        self.hashes = hashes

    def pack(self, items: List[tuple]) -> tuple:
        """New parts and fields for the receiver's tables, then each state as
        its fields' places.  Fields and parts are keyed by value per field
        (and per type): ``(False, False) == (0, 0)``, and ``room_slots``
        must not be sent as ``aborted_by_client``.  Within one message a
        field object already placed is known by its identity (a successor
        shares most fields with its parent and siblings; the items keep every
        object alive while the message is built)."""
        parts, new_fields, new_parts = self.parts, [], []
        seen: Dict[int, int] = {}

        def part(x) -> int:
            key = (type(x), x)
            i = parts.get(key)
            if i is None:
                i = parts[key] = len(parts)
                new_parts.append(x)
            return i

        def field(table: Dict[tuple, int], x: tuple) -> int:
            i = seen.get(id(x))
            if i is None:
                i = table.get(x)
                if i is None:
                    i = table[x] = self.placed
                    self.placed += 1
                    new_fields.append(tuple([part(y) for y in x]))
                seen[id(x)] = i
            return i

        tables, hashes = self.fields, self.hashes
        body = [(tuple([field(t, x) for t, x in zip(tables, _GET_FIELDS(s))]), tag, inst, own,
                 hash(s) if hashes else None)
                for s, tag, inst, own in items]
        return new_parts, new_fields, body

    def unpack(self, msg: tuple) -> List[tuple]:
        new_parts, new_fields, body = msg
        parts, table, known = self.part_table, self.field_table, self.interned
        parts.extend([known.setdefault(x, x) if type(x) in _RECORDS else x for x in new_parts])
        table.extend(tuple([parts[i] for i in f]) for f in new_fields)
        out = []
        for enc, tag, inst, own, h in body:
            s = State(*[table[i] for i in enc])
            if h is not None:  # the sender's hash (``hashes``)
                _set_hash(s, h)
            out.append((s, tag, inst, own))
        return out


def _worker(shard: _Shard, k: int, n: int, inboxes, conn) -> None:
    """One forked worker: rounds until the coordinator says stop."""
    early: List[tuple] = []  # a message of a round's second exchange that came first
    send = [_Codec(hashes=True) for _ in range(n)]  # per shard sent to
    recv = [_Codec(shard.intern.table, hashes=True) for _ in range(n)]  # per shard received from

    def exchange(out: List[list], phase: int) -> Iterator[list]:
        """Send each other shard its list, and yield this shard's own list,
        then each other shard's as it arrives: the shard works on what it
        has while the others finish (``forms`` and ``resolve`` give the same
        answer in any order of their lists).  The lists of the round's first
        exchange all come before any shard starts its second.  A channel's
        messages arrive in the order they were sent (one queue per receiver,
        one feeder thread per sender) and are unpacked in that order, as its
        table needs."""
        for o in range(n):
            if o != k:
                inboxes[o].put((phase, k, send[o].pack(out[o])))
        yield out[k]
        mine = [m for m in early if m[0] == phase]
        early[:] = [m for m in early if m[0] != phase]
        for _, src, body in mine:
            yield recv[src].unpack(body)
        got = 1 + len(mine)
        while got < n:
            m = inboxes[k].get()
            if m[0] == phase:
                got += 1
                yield recv[m[1]].unpack(m[2])
            else:
                early.append(m)

    usercode.rearm_after_fork()
    try:
        shard.keep_part(k, n)
        while True:
            batches = exchange(shard.forms(exchange(shard.expand(), 0)), 1)
            conn.send((shard.resolve(batches), list(shard.found)))
            vids, final = conn.recv()
            shard.assign(vids)
            if final:
                conn.send(shard.result())
                conn.send(shard.states(conn.recv()))
                return
    except usercode.UserCodeError as exc:  # a proposal's error: the user's one line
        conn.send(_Failure(traceback.format_exc(), str(exc)))
    except BaseException:  # pragma: no cover - reported by the coordinator
        conn.send(_Failure(traceback.format_exc()))


def explore(release: Release, scenario: Scenario, props: Sequence[Property], workers: int,
            max_states: int, stop_early: bool = True, symmetry: bool = True,
            keep_states: bool = False, fork_at: int = FORK_AT) -> Exploration:
    """``exhaustive.explore`` without the graph, over ``workers`` processes
    once a level holds ``fork_at`` states."""
    return exhaustive.explore(release, scenario, props, max_states=max_states,
                              stop_early=stop_early, keep_graph=False, symmetry=symmetry,
                              keep_states=keep_states, workers=workers, fork_at=fork_at)


@attrs.define
class Prefix:
    """The sequential engine's search at the start of a level: what the
    workers go on from (``exhaustive._explore`` hands it over)."""

    ctx: Ctx
    props: Sequence[Property]
    applicable: List[Property]
    checks: Checks
    canon: object
    intern: _Interner
    ids: Dict[State, int]
    states: List[State]
    parent: List[Tuple[int, object]]
    depth: List[int]
    found: Dict[str, tuple]  # name -> ("state", v) | ("transition", u, step) | ("reached", v)
    fired: set
    emitted: set
    edges: int
    ledges: Optional[liveness.Edges]
    t0: float


def resume(pre: Prefix, workers: int, max_states: int, stop_early: bool,
           keep_states: bool, cluster=None) -> Exploration:
    """Fork the workers on the prefix's last level and search on, round by
    round, to the sequential engine's answer.  ``cluster(shard, workers)``
    starts the shards somewhere else (``engines.raycluster``: actors on a
    Ray cluster); by default they are forked processes (``_Processes``)."""
    ctx, applicable = pre.ctx, pre.applicable
    graph_props = [p for p in applicable if p.kind.on_graph]
    parents = [u for u, _ in pre.parent]
    depth = pre.depth
    levels = [0] + [v for v in range(1, len(depth)) if depth[v] != depth[v - 1]] + [len(depth)]
    shard = _Shard(ctx, pre.checks, pre.canon, want_edges=bool(graph_props))
    shard.intern, shard.ids = pre.intern, pre.ids
    shard.frontier = [(v, pre.states[v]) for v in range(levels[-2], len(depth))]
    # what the prefix saw, keyed so that it sorts before anything a worker sees
    tag = {name: (hit[1] if hit[0] == "transition" else parents[hit[1]]) * _J
           for name, hit in pre.found.items()}
    seen = [({name: (tag[name], hit) for name, hit in pre.found.items()},
             dict.fromkeys(pre.fired, -1), dict.fromkeys(pre.emitted, -1),
             [(-1, pre.edges)], [], [])]
    ledges = pre.ledges
    pre.ids = pre.states = pre.parent = None  # the workers hold them now
    nodes = (cluster or _Processes)(shard, workers)
    del shard
    try:
        final = False
        while not final:
            msgs = nodes.round()
            merged = list(heapq.merge(*[[(t, w) for t in ts] for w, (ts, _) in enumerate(msgs)]))
            vids: List[List[int]] = [[] for _ in msgs]
            base = len(parents)
            for i, (t, w) in enumerate(merged):
                vids[w].append(base + i)
                parents.append(t // _J)
            levels.append(len(parents))
            if exhaustive.on_progress is not None:
                exhaustive.on_progress({"states": len(parents), "depth": len(levels) - 2,
                                        "frontier": len(merged),
                                        "seconds": time.perf_counter() - pre.t0})
            names = set(seen[0][0]).union(*(ns for _, ns in msgs))
            final = (not merged or len(parents) > max_states
                     or (stop_early and len(names) == len(applicable)))
            nodes.ids(vids, final)
        seen += nodes.results()
        found = _merge_found(seen)
        n, last = _cut(found, parents, len(applicable), stop_early)
        if n > max_states:
            raise BoundExceeded.of(max_states, ctx.scenario, ctx.release)
        wanted = None if graph_props or keep_states else _wanted(found, parents)
        got = nodes.states(wanted)
    except BaseException:
        nodes.kill()  # the others wait for the failed one's messages
        raise
    finally:
        nodes.close()
    seconds = time.perf_counter() - pre.t0

    # every state, or (a dict) those on the counterexample paths
    states = [got[v] for v in range(n)] if wanted is None else got
    if ledges is not None:
        target = {e[0]: e[1] for r in seen for e in r[4]}
        edges = [e for r in seen for e in r[4] if e[0] // _J <= last]
        edges += [(t, target[first], inst, own) for r in seen for t, first, inst, own in r[5]
                  if t // _J <= last]
        for t, v, inst, own in sorted(edges):
            ledges.add_instance(t // _J, v, inst, own)
    found = {name: hit for name, (_, hit) in found.items()}
    verdicts = verdicts_of(ctx, pre.props, applicable, found, states, _ParentList(parents),
                           ledges, pre.canon)
    return Exploration(
        release=ctx.release, scenario=ctx.scenario, verdicts=verdicts, states=n,
        edges=sum(c for r in seen for u, c in r[3] if u <= last),
        depth=next(d for d in range(len(levels) - 1, -1, -1) if levels[d] < n),
        seconds=seconds, complete=n == last + 1, graph=None,
        state_of=states if keep_states else None,
        fired=frozenset(a for r in seen for a, u in r[1].items() if u <= last),
        emitted=frozenset(e for r in seen for e, u in r[2].items() if u <= last),
        workers=workers)


class _Processes:
    """The shards as forked processes (``_worker``), each exchanging its
    successors with the others through queues, and with the coordinator
    through a pipe."""

    def __init__(self, shard: _Shard, workers: int) -> None:
        self.procs, self.conns = _fork(shard, workers)

    def round(self) -> List[Tuple[List[int], List[str]]]:
        """One level: each shard's sorted tags of new states and the names
        of the properties it has a hit for."""
        return [_recv(c) for c in self.conns]

    def ids(self, vids: List[List[int]], final: bool) -> None:
        for c, ids in zip(self.conns, vids):
            c.send((ids, final))

    def results(self) -> list:
        return [_recv(c) for c in self.conns]

    def states(self, wanted: Optional[set]) -> Dict[int, State]:
        got: Dict[int, State] = {}
        for c in self.conns:
            c.send(wanted)
        for c in self.conns:
            got.update(_recv(c))
        return got

    def kill(self) -> None:
        for p in self.procs:
            p.kill()

    def close(self) -> None:
        for p in self.procs:
            p.join()


class _ParentList:
    """``parent[v][0]``, as ``exhaustive`` reads it, over the id array."""

    def __init__(self, parents: List[int]) -> None:
        self.parents = parents

    def __getitem__(self, v: int) -> Tuple[int, None]:
        return self.parents[v], None


def _fork(shard: _Shard, workers: int):
    mp = multiprocessing.get_context("fork")
    inboxes = [mp.Queue() for _ in range(workers)]
    procs, conns = [], []
    for k in range(workers):
        mine, theirs = mp.Pipe()
        p = mp.Process(target=_worker, args=(shard, k, workers, inboxes, theirs), daemon=True)
        p.start()
        procs.append(p)
        conns.append(mine)
    return procs, conns


@attrs.frozen
class _Failure:
    """What a worker sends instead of its next message when it fails."""

    traceback: str
    user_error: Optional[str] = None  # a proposal's own failure, already one line


def _recv(conn):
    msg = conn.recv()
    if isinstance(msg, _Failure):
        if msg.user_error is not None:
            raise usercode.UserCodeError(msg.user_error)
        raise RuntimeError(f"an exploration worker failed:\n{msg.traceback}")
    return msg


def _merge_found(results) -> Dict[str, Tuple[int, tuple]]:
    """Each property's first hit over every source: the least tag."""
    out: Dict[str, Tuple[int, tuple]] = {}
    for found, *_ in results:
        for name, hit in found.items():
            if name not in out or hit[0] < out[name][0]:
                out[name] = hit
    return out


def _cut(found, parents: List[int], applicable: int, stop_early: bool) -> Tuple[int, int]:
    """Where the sequential engine stops: (states it holds, the last state it
    expanded).  It stops once every property has its first hit, after
    expanding the state whose step gave the last one."""
    n = len(parents)
    if not stop_early or len(found) < applicable:
        return n, n - 1
    last = max(tag // _J for tag, _ in found.values()) if found else -1
    # states are numbered in tag order, so their parents never decrease:
    # the states met from states up to ``last`` come first
    return bisect.bisect_right(parents, last, 1), last


def _wanted(found, parents: List[int]) -> set:
    """The states on the paths to the first hits (every hit names its
    state's id second: ("state", v), ("reached", v), ("transition", v, step))."""
    return {0}.union(*(_path(hit[1], _ParentList(parents)) for _, hit in found.values()))
