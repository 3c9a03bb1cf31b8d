"""Guard points as Z3 formulas, derived from the guard functions themselves.

A guard point (``reqmodel.guards``) is a Python function of request fields.
``paths(gp, fn)`` runs that very function on a *symbolic request*: every read
of a finite-domain field (a ``Finish`` or ``None``, a flag) forks the run over
the field's values, integers stay Z3 terms, and a test on a symbolic
comparison forks over its two outcomes, dropping the outcome Z3 finds
impossible on the path so far. Each run is one *path*: the conditions it took
(a Z3 formula over the request) and the value the guard returned. Re-running
the function once per path enumerates them all (depth-first over the
decisions), so the encoding is the function, not a second copy of it;
``tests/test_symbolic.py`` checks on random requests that the formula and the
function agree.

``diff(A, B)`` asks Z3, per guard point, for the request states where two
releases or proposals decide differently, one *region* per pair of paths
with different results whose conditions can hold together.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import attrs
import z3

from reqmodel import messages, usercode
from reqmodel.model import guards as g
from reqmodel.model.releases import RELEASES
from reqmodel.model.state import ABORT_400, ABORT_500, LENGTH, Finish, client_abort

MAX_PATHS = 20_000


class SymbolicError(ValueError):
    """A guard cannot be encoded (one line for the user)."""


class BadGuard(SymbolicError):
    """A guard that is wrong whatever the model does: on some path it returns
    what its point cannot return, or it does not return at all."""


# ----------------------------------------------------------------- domains

def _finishes() -> Tuple[Optional[Finish], ...]:
    """Every finish reason the model produces: intake reject, failure, length,
    and each release's client-abort status."""
    out = [None, ABORT_400, ABORT_500, LENGTH]
    for r in RELEASES.values():
        f = client_abort(r.client_abort_status)
        if f not in out:
            out.append(f)
    return tuple(out)


FINISHES = _finishes()
ABORTS = {f for f in FINISHES if f is not None and f.is_abort}
BOOLS = (False, True)


class Opaque:
    """A value a guard may test for None or truth, but not look into."""

    def __init__(self, what: str):
        self.what = what

    def __eq__(self, other):
        raise SymbolicError(f"compares {self.what}, which the encoding keeps opaque")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.what


DIGEST = Opaque("a digest")

# A field is ("enum", values) (forks on read), ("optional", (None, opaque))
# (forks on read: None or some value), ("int", lower bound) (a Z3 integer),
# or ("const", value) (the view says it never varies).
Domain = Tuple[str, Any]
ENUMS = ("enum", "optional")
FIELD_DOMAINS: Dict[str, Dict[str, Domain]] = {
    "prefill req": {
        "to_finish": ("enum", FINISHES), "finished_reason": ("enum", FINISHES),
        "origin_pages": ("int", 1), "is_retracted": ("enum", BOOLS),
        "holds_kv": ("enum", BOOLS), "holds_mamba": ("enum", BOOLS),
        "metadata_buffer_index": ("int", -1), "retraction_backup": ("const", None),
        "pending_bootstrap": ("enum", BOOLS), "inflight_middle_chunks": ("int", 0),
        "has_sender": ("enum", BOOLS), "session_slot": ("enum", BOOLS),
        "cache_handle": ("enum", BOOLS),
    },
    "decode req": {
        "to_finish": ("enum", FINISHES), "finished_reason": ("enum", FINISHES),
        "origin_pages": ("int", 1), "is_retracted": ("enum", BOOLS),
        "holds_kv": ("enum", BOOLS), "holds_mamba": ("const", False),
        "metadata_buffer_index": ("const", -1), "retraction_backup": ("enum", BOOLS),
        "rebootstrap": ("enum", BOOLS), "reserved_pages": ("int", 0),
        "prefix_pages": ("int", 0), "session_slot": ("enum", BOOLS),
        "cache_handle": ("enum", BOOLS),
    },
    "slot": {
        "room": ("int", 0), "covered_pages": ("int", 0),
        "checksum": ("optional", (None, DIGEST)),
    },
}
# arguments that are not views
PLAIN_ARGS: Dict[str, Domain] = {
    "is_retracted": ("enum", BOOLS), "is_rebootstrap": ("enum", BOOLS),
    "still_chunking": ("enum", BOOLS), "expected_room": ("int", 1),
}


def arg_domains(gp_name: str) -> Dict[str, Dict[str, Domain]]:
    """argument -> field -> domain; a plain argument is the field ``""``."""
    gp = g.GUARD_POINTS[gp_name]
    out = {}
    for a in gp.args:
        view = g.VIEW_OF_ARG.get((gp_name, a))
        out[a] = FIELD_DOMAINS[view] if view else {"": PLAIN_ARGS[a]}
    return out


def var_name(arg: str, field: str) -> str:
    return f"{arg}.{field}" if field else arg


def z3_var(arg: str, field: str):
    """The Z3 variable of a field: the value's index for an enum, else an Int."""
    return z3.Int(var_name(arg, field))


def domain_constraints(gp_name: str) -> List[z3.BoolRef]:
    out = []
    for arg, fields in arg_domains(gp_name).items():
        for field, dom in fields.items():
            v = z3_var(arg, field)
            if dom[0] in ENUMS:
                out += [v >= 0, v < len(dom[1])]
            elif dom[0] == "int":
                out.append(v >= dom[1])
    return out


# ----------------------------------------------------------- symbolic values

class _Infeasible(Exception):
    pass


class _Run:
    """One execution along a path: ``prefix`` fixes the first decisions."""

    def __init__(self, prefix: Sequence[int], base: Sequence[z3.BoolRef]):
        self.prefix = list(prefix)
        self.decisions: List[int] = []
        self.arity: List[int] = []
        self.conds: List[z3.BoolRef] = []
        self.solver = z3.Solver()
        self.solver.add(*base)
        self.reads: Dict[str, Any] = {}

    def choose(self, n: int) -> int:
        k = len(self.decisions)
        d = self.prefix[k] if k < len(self.prefix) else 0
        self.decisions.append(d)
        self.arity.append(n)
        return d

    def assume(self, cond: z3.BoolRef) -> None:
        self.conds.append(cond)
        self.solver.add(cond)

    def branch(self, cond: z3.BoolRef) -> bool:
        """Fork on a symbolic condition; an impossible outcome ends the run."""
        taken = self.choose(2) == 1
        c = cond if taken else z3.Not(cond)
        self.solver.push()
        self.solver.add(c)
        ok = self.solver.check() != z3.unsat
        self.solver.pop()
        if not ok:
            raise _Infeasible()
        self.assume(c)
        return taken


class SymInt:
    """An integer field: arithmetic and comparisons build Z3 terms; a test of
    a comparison forks the run."""

    def __init__(self, run: _Run, term):
        self._run, self.term = run, term

    def _t(self, other):
        if isinstance(other, SymInt):
            return other.term
        if isinstance(other, bool) or not isinstance(other, int):
            raise SymbolicError(f"compares an integer field with {other!r}")
        return other

    def __add__(self, o): return SymInt(self._run, self.term + self._t(o))
    __radd__ = __add__
    def __sub__(self, o): return SymInt(self._run, self.term - self._t(o))
    def __rsub__(self, o): return SymInt(self._run, self._t(o) - self.term)
    def __neg__(self): return SymInt(self._run, -self.term)
    def __lt__(self, o): return SymBool(self._run, self.term < self._t(o))
    def __le__(self, o): return SymBool(self._run, self.term <= self._t(o))
    def __gt__(self, o): return SymBool(self._run, self.term > self._t(o))
    def __ge__(self, o): return SymBool(self._run, self.term >= self._t(o))
    def __eq__(self, o): return SymBool(self._run, self.term == self._t(o))
    def __ne__(self, o): return SymBool(self._run, self.term != self._t(o))
    def __bool__(self): return self._run.branch(self.term != 0)
    __hash__ = None

    def __index__(self):
        raise SymbolicError("uses an integer field as an index or a count")


class SymBool:
    """The outcome of a comparison: a test of it forks the run."""

    def __init__(self, run: _Run, term):
        self._run, self.term = run, term

    def __bool__(self):
        return self._run.branch(self.term)

    def __invert__(self):
        return SymBool(self._run, z3.Not(self.term))


class SymView:
    """A request (or slot) whose fields are read symbolically."""

    def __init__(self, run: _Run, arg: str, fields: Dict[str, Domain]):
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_arg", arg)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "_fields")
        if name not in fields:
            raise AttributeError(name)
        return _read(self._run, self._arg, name, fields[name])

    def __setattr__(self, name, value):
        raise attrs.exceptions.FrozenInstanceError()


def _read(run: _Run, arg: str, field: str, dom: Domain):
    key = var_name(arg, field)
    if key in run.reads:
        return run.reads[key]
    kind, spec = dom
    if kind == "const":
        val = spec
    elif kind in ENUMS:
        i = run.choose(len(spec))
        run.assume(z3_var(arg, field) == i)
        val = spec[i]
    else:
        val = SymInt(run, z3_var(arg, field))
    run.reads[key] = val
    return val


# -------------------------------------------------------------------- paths

@attrs.frozen
class Path:
    cond: z3.BoolRef
    result: Any
    reads: Tuple[str, ...]  # the variables the path read, in order

    def __str__(self) -> str:
        return f"{self.cond} -> {show(self.result)}"


def show(v) -> str:
    return str(v) if isinstance(v, Finish) else repr(v)


def _concrete(v):
    """A guard may return a comparison without testing it: test it here."""
    if isinstance(v, SymBool):
        return bool(v)
    if isinstance(v, SymInt):
        raise BadGuard("returns an integer field")
    return v


def unwrap(fn: Callable) -> Callable:
    """A proposal's guard is wrapped to check concrete results; encode the
    function it wraps."""
    return getattr(fn, "__wrapped__", fn)


def paths(gp_name: str, fn: Callable) -> Tuple[Path, ...]:
    """Every path of ``fn`` at guard point ``gp_name``, depth-first."""
    gp = g.GUARD_POINTS[gp_name]
    doms = arg_domains(gp_name)
    base = domain_constraints(gp_name)
    f = unwrap(fn)
    limit = usercode.guard_seconds()
    out: List[Path] = []
    stack: List[List[int]] = [[]]
    while stack:
        prefix = stack.pop()
        run = _Run(prefix, base)
        args = [_read(run, a, "", doms[a][""]) if "" in doms[a] else SymView(run, a, doms[a])
                for a in gp.args]
        usercode.enter(gp_name, limit)
        try:
            result = _concrete(f(*args))
        except _Infeasible:
            result = _Infeasible
        except BadGuard as exc:
            raise BadGuard(f"{_label(gp_name, f)} {exc} on some request") from None
        except SymbolicError as exc:
            raise SymbolicError(f"{_label(gp_name, f)} cannot be encoded: it {exc}") from None
        except KeyboardInterrupt:
            raise
        except usercode.Overrun:
            raise BadGuard(usercode.overrun_message(_label(gp_name, f))
                           + " on a symbolic request") from None
        except BaseException as exc:
            raise SymbolicError(f"{_label(gp_name, f)} raised {usercode.describe(exc)} "
                                "on a symbolic request") from None
        finally:
            usercode.leave()
        for k in range(len(prefix), len(run.decisions)):
            for j in range(1, run.arity[k]):
                stack.append(run.decisions[:k] + [j])
        if result is _Infeasible:
            continue
        if not gp.valid(result):
            raise BadGuard(f"{_label(gp_name, f)} returns {_short(result)} "
                           f"({type(result).__name__}) on some request; it must return "
                           f"{gp.returns}{_where(run.conds)}")
        out.append(Path(z3.And(*run.conds) if run.conds else z3.BoolVal(True), result,
                        tuple(run.reads)))
        if len(out) > MAX_PATHS:
            raise SymbolicError(f"{_label(gp_name, f)} has more than {MAX_PATHS} paths")
    return tuple(out)


_short = messages.short


def _where(conds: Sequence[z3.BoolRef]) -> str:
    """Where a path goes, for a message: its conditions, cut short."""
    if not conds:
        return ""
    text = " ".join(str(z3.And(*conds) if len(conds) > 1 else conds[0]).split())
    return f" (when {text if len(text) <= 100 else text[:97] + '...'})"


def _name(f: Callable) -> str:
    return getattr(f, "__name__", repr(f))


def _label(gp_name: str, f: Callable) -> str:
    """The guard point, and the function when its name differs."""
    name = _name(f)
    return gp_name if name == gp_name else f"{gp_name} ({name})"


# ---------------------------------------------------- concrete assignments

def assignment(gp_name: str, args: Sequence[Any]) -> Dict[str, Any]:
    """The Z3 variable values of a concrete call of the guard point."""
    gp = g.GUARD_POINTS[gp_name]
    out = {}
    for a, value in zip(gp.args, args):
        for field, dom in arg_domains(gp_name)[a].items():
            v = getattr(value, field) if field else value
            if dom[0] == "optional":
                out[var_name(a, field)] = 0 if v is None else 1
            elif dom[0] in ENUMS:
                if v not in dom[1]:
                    raise SymbolicError(f"{var_name(a, field)} = {v!r} is outside its domain")
                out[var_name(a, field)] = dom[1].index(v)
            elif dom[0] == "int":
                out[var_name(a, field)] = int(v)
    return out


def holds(cond: z3.BoolRef, values: Dict[str, Any]) -> bool:
    """Evaluate a path condition on a concrete assignment."""
    subst = [(z3.Int(k), z3.IntVal(v)) for k, v in values.items()]
    return z3.is_true(z3.simplify(z3.substitute(cond, *subst)))


# -------------------------------------------------------------------- diff

@attrs.frozen
class Region:
    """Request states where A and B decide differently: every field
    constraint in ``fields`` holds (a field not named can take any value),
    A returns ``a`` and B returns ``b``; ``witness`` is one such state."""

    gp: str
    cond: z3.BoolRef
    fields: Tuple[str, ...]
    a: Any
    b: Any
    witness: Dict[str, Any]


def diff_point(gp_name: str, fa: Callable, fb: Callable) -> List[Region]:
    """The request states where two implementations of a guard point differ,
    as a short list of regions per pair of results (``cover``)."""
    pa, pb = paths(gp_name, fa), paths(gp_name, fb)
    by_result: Dict[Tuple, List[z3.BoolRef]] = {}
    for x, y in itertools.product(pa, pb):
        if x.result != y.result:
            by_result.setdefault((x.result, y.result), []).append(z3.And(x.cond, y.cond))
    out = []
    for (a, b), conds in by_result.items():
        for cube, witness in cover(gp_name, z3.Or(*conds)):
            out.append(Region(gp_name, cube, tuple(describe(cube, gp_name)), a, b, witness))
    return out


def cover(gp_name: str, u: z3.BoolRef) -> List[Tuple[z3.BoolRef, Dict[str, Any]]]:
    """``u`` as a union of cubes, each as general as it can be: take a state
    in ``u`` not yet covered, describe it by its enum values and the truth of
    each comparison ``u`` mentions, then widen each enum to every value and
    drop each comparison that keeps the cube inside ``u``."""
    doms = {var_name(a, f): d for a, fs in arg_domains(gp_name).items() for f, d in fs.items()}
    base = domain_constraints(gp_name)
    atoms = _atoms(u, doms)
    enums = [n for n, d in doms.items() if d[0] in ENUMS]
    inside = z3.Solver()
    inside.add(*base, z3.Not(u))  # cube & not(u) unsat <=> cube within u
    todo = z3.Solver()
    todo.add(*base, u)
    out = []
    while todo.check() == z3.sat:
        m = todo.model()
        vals = {n: {m.eval(z3.Int(n), model_completion=True).as_long()} for n in enums}
        lits = {a: z3.is_true(m.eval(a, model_completion=True)) for a in atoms}

        def cube(vals, lits):
            parts = [z3.Or(*[z3.Int(n) == i for i in sorted(v)]) for n, v in vals.items()
                     if v is not None]
            parts += [a if t else z3.Not(a) for a, t in lits.items()]
            return z3.And(*parts) if parts else z3.BoolVal(True)

        def within(c):
            return inside.check(c) == z3.unsat

        for n in enums:
            for i in range(len(doms[n][1])):
                if i not in vals[n]:
                    wider = dict(vals, **{n: vals[n] | {i}})
                    if within(cube(wider, lits)):
                        vals = wider
            if len(vals[n]) == len(doms[n][1]):
                vals[n] = None  # any value
        for a in list(lits):
            rest = {k: t for k, t in lits.items() if k is not a}
            if within(cube(vals, rest)):
                lits = rest
        c = cube(vals, lits)
        witness = _witness(gp_name, m)
        out.append((c, witness))
        todo.add(z3.Not(c))
    return out


def _atoms(u, doms) -> List:
    """The comparisons of ``u`` that are not enum tests."""
    out, seen = [], set()

    def walk(e):
        if z3.is_and(e) or z3.is_or(e) or z3.is_not(e):
            for ch in e.children():
                walk(ch)
            return
        if z3.is_true(e) or z3.is_false(e):
            return
        if z3.is_eq(e):
            lhs, rhs = e.children()
            if z3.is_const(lhs) and str(lhs) in doms and doms[str(lhs)][0] in ENUMS:
                return
        key = e.sexpr()
        if key not in seen:
            seen.add(key)
            out.append(e)
    walk(u)
    return out


def equivalent(gp_name: str, fa: Callable, fb: Callable) -> bool:
    """One Z3 query: is there any request state where they differ?"""
    s = z3.Solver()
    s.add(*domain_constraints(gp_name))
    s.add(z3.Or(*[z3.And(x.cond, y.cond) for x in paths(gp_name, fa)
                  for y in paths(gp_name, fb) if x.result != y.result] or [z3.BoolVal(False)]))
    return s.check() == z3.unsat


def _witness(gp_name: str, m: z3.ModelRef) -> Dict[str, Any]:
    out = {}
    for arg, fields in arg_domains(gp_name).items():
        for field, dom in fields.items():
            name = var_name(arg, field)
            val = m.eval(z3_var(arg, field), model_completion=True).as_long()
            out[name] = dom[1][val] if dom[0] in ENUMS else (
                dom[1] if dom[0] == "const" else val)
    return out


def describe(cond: z3.BoolRef, gp_name: str) -> List[str]:
    """A condition as readable field constraints: ``to_finish = FINISH_ABORT(500)``."""
    doms = {var_name(a, f): d for a, fs in arg_domains(gp_name).items() for f, d in fs.items()}
    parts = []
    for c in _conjuncts(cond):
        parts.append(_describe_atom(c, doms))
    return parts


def _conjuncts(c) -> Iterable:
    if z3.is_and(c):
        for ch in c.children():
            yield from _conjuncts(ch)
    elif z3.is_true(c):
        return
    else:
        yield c


def _describe_atom(c, doms: Dict[str, Domain]) -> str:
    if z3.is_or(c):  # var == i or var == j ...: a set of enum values
        names = {str(ch.children()[0]) for ch in c.children() if z3.is_eq(ch)}
        if len(names) == 1 and all(z3.is_eq(ch) for ch in c.children()):
            name = names.pop()
            if name in doms and doms[name][0] in ENUMS:
                vals = [doms[name][1][ch.children()[1].as_long()] for ch in c.children()]
                if len(vals) == 1:
                    return f"{name} = {_val(vals[0])}"
                if set(vals) == ABORTS:
                    return f"{name} is a FINISH_ABORT (any status)"
                return f"{name} in {{{', '.join(_val(v) for v in vals)}}}"
    neg = z3.is_not(c)
    e = c.children()[0] if neg else c
    if z3.is_eq(e):  # an enum variable alone: (var == i) or not(var == i)
        lhs, rhs = e.children()
        if z3.is_const(lhs) and z3.is_int_value(rhs) and str(lhs) in doms \
                and doms[str(lhs)][0] in ENUMS:
            v = doms[str(lhs)][1][rhs.as_long()]
            return f"{lhs} {'!=' if neg else '='} {_val(v)}"
    flipped = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
    ops = {z3.Z3_OP_LT: "<", z3.Z3_OP_LE: "<=", z3.Z3_OP_GT: ">", z3.Z3_OP_GE: ">=",
           z3.Z3_OP_EQ: "==", z3.Z3_OP_DISTINCT: "!="}
    k = e.decl().kind() if z3.is_app(e) else None
    if k in ops and len(e.children()) == 2 and not z3.is_bool(e.children()[0]):
        lhs, rhs = e.children()
        return f"{lhs} {flipped[ops[k]] if neg else ops[k]} {rhs}"
    return str(c).replace("\n", " ")


def _val(v) -> str:
    if isinstance(v, Finish):
        return str(v)
    return repr(v)


# ------------------------------------------------------------ reachability

def observed(release, scenarios, max_states: int) -> Dict[str, List[Tuple[str, Dict[str, Any]]]]:
    """Guard point -> (scenario, assignment) of every distinct call the
    exhaustive model makes on ``release`` in each of ``scenarios``: the
    request states that reach each guard point. The guard functions are
    wrapped to record their arguments; nothing else changes."""
    from reqmodel.engines import exhaustive as explore
    seen: Dict[str, Dict[Tuple, Tuple[str, Dict[str, Any]]]] = {gp: {} for gp in g.GUARD_POINTS}
    current = [""]

    def recorder(gp_name, fn):
        def rec(*args):
            a = assignment(gp_name, args)
            seen[gp_name].setdefault((current[0],) + tuple(sorted(a.items())), (current[0], a))
            return fn(*args)
        return rec

    wrapped = attrs.evolve(release, **{gp: recorder(gp, f)
                                       for gp, f in release.guard_points().items()})
    for sc in scenarios:
        current[0] = sc.name
        explore.explore(wrapped, sc, (), keep_graph=False,
                        max_states=max_states, stop_early=False)
    return {gp: list(v.values()) for gp, v in seen.items()}


def reached(region: Region, calls: Sequence[Tuple[str, Dict[str, Any]]]) -> List[str]:
    """The scenarios in which some recorded call falls in ``region``."""
    return sorted({sc for sc, a in calls if holds(region.cond, a)})


# ------------------------------------------------------------- the query

@attrs.frozen
class Subject:
    """A release or a proposal to compare: its record, and the scenario
    options it forces (a proposal's ``scenario_overrides``)."""

    label: str
    release: Any
    apply: Callable = lambda sc: sc
    overrides: Dict[str, Any] = attrs.field(factory=dict)




def _field(subject: Subject, name: str) -> str:
    if name == "scenario_overrides":
        return repr(subject.overrides) if subject.overrides else "none"
    value = getattr(subject.release, name)
    if name == "checksum":
        return "none" if value is None else getattr(value, "name", repr(value))
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return repr(value)


def subject(spec: str) -> Subject:
    """A release name, or the path of a proposal file."""
    import pathlib
    from reqmodel.proposals import proposal
    from reqmodel.model import releases
    if spec.endswith(".py") or pathlib.Path(spec).is_file():
        p = proposal.load(spec)
        return Subject(p.path, p.release, p.apply, dict(p.scenario_overrides))
    return Subject(spec, releases.get(spec))


@attrs.frozen
class PointDiff:
    name: str
    status: str  # "same" (one implementation) | "equivalent" | "differs"
    a_impl: str
    b_impl: str
    regions: Tuple[Region, ...] = ()
    reached_a: Tuple[Tuple[str, ...], ...] = ()  # per region
    reached_b: Tuple[Tuple[str, ...], ...] = ()


def diff(a: Subject, b: Subject, scenarios=None, max_states: int = 1_500_000,
         points: Optional[Sequence[str]] = None) -> List[PointDiff]:
    """Per guard point: are A and B the same implementation, equivalent on
    every request state (Z3), or where do they differ; with ``scenarios``,
    which regions the exhaustive model reaches at that guard point under A
    and under B."""
    out = []
    obs_a = obs_b = None
    for name in points or (*g.GUARD_POINTS, *g.FIELD_POINTS):
        if name in g.FIELD_POINTS:
            va, vb = _field(a, name), _field(b, name)
            out.append(PointDiff(name, "same" if va == vb else "differs", va, vb))
            continue
        fa, fb = a.release.guard_points()[name], b.release.guard_points()[name]
        ia, ib = _name(unwrap(fa)), _name(unwrap(fb))
        if unwrap(fa) is unwrap(fb):
            out.append(PointDiff(name, "same", ia, ib))
            continue
        regions = tuple(diff_point(name, fa, fb))
        if not regions:
            out.append(PointDiff(name, "equivalent", ia, ib))
            continue
        ra = rb = ()
        if scenarios is not None:
            if obs_a is None:
                obs_a = observed(a.release, [a.apply(s) for s in scenarios], max_states)
                obs_b = observed(b.release, [b.apply(s) for s in scenarios], max_states)
            ra = tuple(tuple(reached(r, obs_a[name])) for r in regions)
            rb = tuple(tuple(reached(r, obs_b[name])) for r in regions)
        out.append(PointDiff(name, "differs", ia, ib, regions, ra, rb))
    return out
