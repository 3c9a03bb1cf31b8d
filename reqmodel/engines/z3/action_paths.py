"""Paths of the actions as guarded assignments over a fixed slot vector.

``reqmodel.symbolic`` runs a guard function on a symbolic *request*; this
module runs the actions themselves (guard, choices, effect, and the
properties on the step) on a *symbolic state*: a state whose scalar fields
are *slots* of a fixed vector (every field of every request, room, page and
metadata slot; for the message tuple ``net``, a length slot and ``max_net``
message slots).  Each read of a slot is recorded.  Run on a concrete state,
a step reads some slots, and since the action is a deterministic function of
what it reads, the run is valid for *every* state that agrees on those slots:
it is one *path* of the action, a guarded assignment (a ``Clause``) whose
guard is "these slots hold these values" and whose effect writes constants
or copies of pre-state slots into the next state.  The slots the run never
read pass through unchanged: the frame condition comes for free.

This is the transition relation the Z3 engine (``reqmodel.bmc``) unrolls.
It is learned lazily, path by path, from the very action code the other
engines run (concolic execution): enumerating every path up front, forking
each read over a domain, was measured to explode (``notes/design.md``,
"The Z3 engine").  ``tests/test_symexec.py`` checks on reachable states that
every learned clause gives exactly the concrete step on every state it
matches.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import attrs

from reqmodel.model.actions import ACTIONS, Action, Ctx, Event, Step, initial_state
from reqmodel.model.properties import Property
from reqmodel.model.state import DRoom, DecodeReq, MetaSlot, Msg, Page, PrefillReq, Room, State

NET_LEN = ("net", "len")
PAD = ("pad",)  # the value of a message slot beyond the length


class NetBound(RuntimeError):
    """A step puts more messages in flight than the layout has slots."""


# ------------------------------------------------------------ slot reads

class Slot:
    """A pre-state slot, not read yet on this run."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __repr__(self):
        return f"Slot{self.key}"


class _NetSlots:
    """The pre-state's ``net``: reading it reads the length slot."""


_NET = _NetSlots()


class Reader:
    """The slot values of one pre-state, and the slots a run has read."""

    def __init__(self, values: Dict[Any, Any]):
        self.values = values
        self.read: Dict[Any, Any] = {}

    def force(self, key):
        v = self.values[key]
        self.read[key] = v
        return v


RUN: Optional[Reader] = None  # the reader of the run in progress


# ---------------------------------------------------------- symbolic objects

_SYM: Dict[type, type] = {}  # state class -> its symbolic subclass
_BASE: Dict[type, type] = {}
# the State fields held whole, one slot each (a tuple of flags or of keys)
_TOP = ("aborted_by_client", "failed_sessions", "prefill_dead", "prefill_lost", "workers_dead")
_MSG_FIELDS = tuple(f.name for f in attrs.fields(Msg))
_STRUCTS = {"p": PrefillReq, "d": DecodeReq, "rooms": Room, "d_pages": Page,
            "d_slots": MetaSlot, "d_rooms": DRoom}


def _sym_class(cls):
    """A subclass of a state class whose fields read slots on access.  Equality,
    ordering and hashing go through the fields (attrs' own would compare the
    classes and call a symbolic message unequal to an equal real one)."""
    if cls in _SYM:
        return _SYM[cls]
    names = tuple(f.name for f in attrs.fields(cls))

    def getter(name):
        def get(self):
            v = self._raw[name]
            if type(v) is Slot:
                return RUN.force(v.key)
            if v is _NET:
                n = RUN.force(NET_LEN)
                return tuple(_sym(Msg, {f: Slot(("net", j, f)) for f in _MSG_FIELDS})
                             for j in range(n))
            return v
        return property(get)

    def key(self):
        return tuple(getattr(self, n) for n in names)

    def cmp(op):
        def f(self, other):
            if not isinstance(other, cls):
                return NotImplemented
            return op(key(self), tuple(getattr(other, n) for n in names))
        return f

    import operator
    ns = {n: getter(n) for n in names}
    ns.update(__slots__=("_raw",), __eq__=cmp(operator.eq), __ne__=cmp(operator.ne),
              __lt__=cmp(operator.lt), __le__=cmp(operator.le), __gt__=cmp(operator.gt),
              __ge__=cmp(operator.ge), __hash__=lambda self: hash(key(self)),
              __repr__=lambda self: f"Sym{cls.__name__}({self._raw})",
              replace_fields=staticmethod(_replace))
    sub = type("Sym" + cls.__name__, (cls,), ns)
    _SYM[cls] = sub
    _BASE[sub] = cls
    return sub


def _sym(cls, raw):
    obj = object.__new__(_sym_class(cls))
    object.__setattr__(obj, "_raw", raw)
    return obj


def _replace(obj, changes):
    raw = dict(obj._raw)
    raw.update(changes)
    return _sym(_BASE[type(obj)], raw)


# ---------------------------------------------------------------- the layout

def _fclass(key) -> Tuple[str, str]:
    """The field a slot holds (slots of one field share their value codes)."""
    if key == NET_LEN:
        return NET_LEN
    if key[0] == "net":
        return ("Msg", key[2])
    if key[0] in _TOP:
        return ("State", key[0])
    return (_STRUCTS[key[0]].__name__, key[2])


@attrs.define
class Layout:
    """Where each scalar of a scenario's state lives."""

    ctx: Ctx
    max_net: int
    sizes: Dict[str, int]
    room_slots: Tuple[int, ...]
    keys: Tuple[Any, ...] = ()

    @classmethod
    def of(cls, ctx: Ctx, max_net: int) -> "Layout":
        s0 = initial_state(ctx.scenario)
        lay = cls(ctx, max_net, {k: len(getattr(s0, k)) for k in _STRUCTS}, s0.room_slots)
        keys = []
        for k, c in _STRUCTS.items():
            for i in range(lay.sizes[k]):
                keys += [(k, i, f.name) for f in attrs.fields(c)]
        keys += [(name,) for name in _TOP] + [NET_LEN]
        for j in range(max_net):
            keys += [("net", j, f) for f in _MSG_FIELDS]
        lay.keys = tuple(keys)
        return lay

    def values(self, s: State) -> Dict[Any, Any]:
        """The slot values of a concrete state."""
        if len(s.net) > self.max_net:
            raise NetBound(f"{len(s.net)} messages in flight, the layout has {self.max_net}")
        out = {}
        for k, c in _STRUCTS.items():
            for i, obj in enumerate(getattr(s, k)):
                for f in attrs.fields(c):
                    out[(k, i, f.name)] = getattr(obj, f.name)
        for name in _TOP:
            out[(name,)] = getattr(s, name)
        out[NET_LEN] = len(s.net)
        for j in range(self.max_net):
            for f in _MSG_FIELDS:
                out[("net", j, f)] = getattr(s.net[j], f) if j < len(s.net) else PAD
        return out

    def state(self, values: Dict[Any, Any]) -> State:
        """The concrete state of a slot vector."""
        parts = {k: tuple(c(*[values[(k, i, f.name)] for f in attrs.fields(c)])
                          for i in range(self.sizes[k]))
                 for k, c in _STRUCTS.items()}
        net = tuple(Msg(*[values[("net", j, f)] for f in _MSG_FIELDS])
                    for j in range(values[NET_LEN]))
        return State(net=net, room_slots=self.room_slots,
                     **{name: values[(name,)] for name in _TOP}, **parts)

    def symbolic(self) -> State:
        parts = {k: tuple(_sym(c, {f.name: Slot((k, i, f.name)) for f in attrs.fields(c)})
                          for i in range(self.sizes[k]))
                 for k, c in _STRUCTS.items()}
        return _sym(State, dict(parts, net=_NET, room_slots=self.room_slots,
                                **{name: Slot((name,)) for name in _TOP}))

    def effect(self, nxt, read: Dict[Any, Any]) -> Dict[Any, Any]:
        """The next state as slot key -> ("const", value) | ("copy", pre key),
        leaving out the slots that keep their own value."""
        out: Dict[Any, Any] = {}

        def put(key, obj, name):
            if type(obj) in _BASE:
                v = obj._raw[name]
                if type(v) is Slot:
                    if v.key != key:
                        out[key] = ("copy", v.key)
                    return
                out[key] = ("const", v)
            else:
                out[key] = ("const", getattr(obj, name))

        raw = nxt._raw
        for k, c in _STRUCTS.items():
            seq = raw[k]
            if len(seq) != self.sizes[k]:
                raise AssertionError(f"{k} changed length")
            for i, obj in enumerate(seq):
                for f in attrs.fields(c):
                    put((k, i, f.name), obj, f.name)
        for name in _TOP:
            put((name,), nxt, name)
        net = raw["net"]
        if net is not _NET:
            if len(net) > self.max_net:
                raise NetBound(f"{len(net)} messages in flight, the layout has {self.max_net}")
            out[NET_LEN] = ("const", len(net))
            for j in range(self.max_net):
                for f in _MSG_FIELDS:
                    if j < len(net):
                        put(("net", j, f), net[j], f)
                    else:
                        out[("net", j, f)] = ("const", PAD)
        # a constant equal to what the slot held and was read: no change
        for key in [k for k, v in out.items() if v[0] == "const" and k in read
                    and read[k] == v[1]]:
            del out[key]
        return out


# ---------------------------------------------------------------- clauses

def satisfied(cond: Tuple[Tuple[Any, Any], ...], values: Dict[Any, Any]) -> bool:
    """A path condition holds on the state with these slot values."""
    return all(values[k] == v for k, v in cond)


@attrs.frozen
class Clause:
    """One path of one action instance, with one choice: a guarded assignment.
    ``arg`` is None for the path on which the action is not enabled."""

    action: str
    rid: int
    arg: Optional[Tuple]
    cond: Tuple[Tuple[Any, Any], ...]  # (slot key, value) read on the path
    effect: Tuple[Tuple[Any, Any], ...]  # (slot key, ("const", v) | ("copy", key))
    events: Tuple[Event, ...] = ()
    broken: Tuple[str, ...] = ()  # properties the step breaks (or reaches)

    @property
    def step(self) -> Step:
        return Step(self.action, self.rid, self.arg)

    def matches(self, values: Dict[Any, Any]) -> bool:
        return satisfied(self.cond, values)

    def apply(self, values: Dict[Any, Any]) -> Dict[Any, Any]:
        out = dict(values)
        for k, (kind, v) in self.effect:
            out[k] = v if kind == "const" else values[v]
        return out


def learn(lay: Layout, values: Dict[Any, Any], a: Action, rid: int,
          props: Sequence[Property] = ()) -> List[Clause]:
    """The path action ``a`` on request ``rid`` takes from the state with these
    slot values: one clause per choice, or one disabled clause.  Transition
    properties are evaluated on each step inside the same run, so the slots
    they read are part of the clause's condition; state properties are
    predicates of their own (``learn_predicate``): read inside the action's
    run they would split every path by the slots they read (on incident
    0.5.19, 2,642 enabled clauses instead of 652)."""
    global RUN
    ctx = lay.ctx
    reader = Reader(values)
    prev, RUN = RUN, reader
    try:
        pre = lay.symbolic()
        out = []
        if a.enabled(ctx, pre, rid):
            for arg in a.args(ctx, pre, rid):
                arg = tuple(arg)
                nxt, evs = a.effect(ctx, pre, rid, arg)
                step = Step(a.name, rid, arg)
                broken = tuple(p.name for p in props
                               if p.transition and not p.holds_on(pre, step, evs, nxt))
                out.append((arg, nxt, tuple(evs), broken))
        clauses = []
        for arg, nxt, evs, broken in out:
            eff = lay.effect(nxt, reader.read)
            clauses.append((arg, eff, evs, broken))
        cond = tuple(sorted(reader.read.items(), key=lambda kv: repr(kv[0])))
    finally:
        RUN = prev
    if not clauses:
        return [Clause(a.name, rid, None, cond, ())]
    return [Clause(a.name, rid, arg, cond, tuple(sorted(eff.items(), key=lambda kv: repr(kv[0]))),
                   evs, broken) for arg, eff, evs, broken in clauses]


def learn_predicate(lay: Layout, values: Dict[Any, Any], fn) -> Tuple[Tuple, bool]:
    """The path a state predicate takes on the state with these slot values:
    the slots it read and what it returned."""
    global RUN
    reader = Reader(values)
    prev, RUN = RUN, reader
    try:
        result = bool(fn(lay.symbolic()))
    finally:
        RUN = prev
    return tuple(sorted(reader.read.items(), key=lambda kv: repr(kv[0]))), result


def instances(ctx: Ctx) -> List[Tuple[Action, int]]:
    """Every (action, request) the scenario can ever enable."""
    return [(a, r) for a in ACTIONS for r in range(ctx.scenario.n)
            if not a.event_flag or ctx.scenario.events.on(a.event_flag, r)]
