"""Benchmark: what compiling with mypyc would buy the exhaustive engine's
record work, and what it would cost the model (issue #27).

Two thirds of an exhaustive step is the model's own code: copying frozen
records with one field changed, reading their fields, hashing the result
(notes/performance.md). This measures that unit of work, a 24-field record
like ``PrefillReq``: copy with one field changed, read ten fields, hash the
copy, in five forms:

* ``model``: the model's own ``PrefillReq`` and ``state.replace`` (today);
* ``attrs, mypyc``: an ``attrs.frozen(cache_hash=True)`` class in a module
  compiled by mypyc (mypyc does not make it a native class: ``attrs.frozen``
  is not one of the decorators it compiles natively);
* ``attr.s frozen, mypyc native``: ``attr.s(frozen=True)``, which mypyc does
  compile as a native class; attrs' generated ``__init__`` then fails (it
  writes through ``__dict__`` or ``object.__setattr__``, which a native class
  does not have): reported, not timed;
* ``plain slotted class``: the same record without attrs (a hand-written
  ``__init__``, a copy method, a tuple key for the hash), interpreted;
* ``plain class, mypyc native``: that module compiled by mypyc.

Usage (needs mypy, which brings mypyc, and a C compiler)::

    pip install mypy
    python benchmarks/bench_compiled_records.py [--n 200000] [--markdown]
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time

FIELDS = [f"f{i}" for i in range(24)]
READ = ("f1", "f2", "f3", "f5", "f7", "f11", "f13", "f17", "f19", "f23")


def _attrs_module(decorator: str, imports: str) -> str:
    reads = " + ".join(f"r.{f}" for f in READ)
    args = ", ".join("i" if f == "f3" else f"r.{f}" for f in FIELDS)
    return (f"from __future__ import annotations\n{imports}\n\n{decorator}\nclass R:\n"
            + "".join(f"    {f}: int = 0\n" for f in FIELDS)
            + "\n\ndef work(n: int) -> int:\n    r = R()\n    acc = 0\n"
            + f"    for i in range(n):\n        r = R({args})\n"
            + f"        acc += {reads}\n        acc += hash(r) & 1\n    return acc\n")


def _plain_module() -> str:
    reads = " + ".join(f"r.{f}" for f in READ)
    return ("from __future__ import annotations\n\n\nclass R:\n"
            f"    __slots__ = ({', '.join(repr(f) for f in FIELDS)},)\n"
            + "".join(f"    {f}: int\n" for f in FIELDS)
            + f"\n    def __init__(self, {', '.join(f'{f}: int = 0' for f in FIELDS)}) -> None:\n"
            + "".join(f"        self.{f} = {f}\n" for f in FIELDS)
            + "\n    def with_f3(self, v: int) -> R:\n"
            + f"        return R({', '.join('v' if f == 'f3' else f'self.{f}' for f in FIELDS)})\n"
            + "\n    def key(self) -> tuple[int, ...]:\n"
            + f"        return ({', '.join(f'self.{f}' for f in FIELDS)},)\n"
            + "\n\ndef work(n: int) -> int:\n    r = R()\n    acc = 0\n"
            + "    for i in range(n):\n        r = r.with_f3(i)\n"
            + f"        acc += {reads}\n        acc += hash(r.key()) & 1\n    return acc\n")


def _model_work(n: int) -> int:
    from reqmodel.model import state
    r = state.PrefillReq()
    acc = 0
    for i in range(n):
        r = state.replace(r, extend_end=i)
        acc += (r.origin_pages + r.kv_pages + r.extend_end + r.send_pages + r.sent
                + r.requeues_left + int(r.holds_metadata) + int(r.has_sender)
                + int(r.is_retracted) + int(r.rejected))
        acc += hash(r) & 1
    return acc


def _time(fn, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        fn(n)
        best = min(best, time.process_time() - c0)
    return best * 1e6 / n  # microseconds per unit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="units of work per timing")
    ap.add_argument("--repeat", type=int, default=3, help="timings per form (best taken)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    try:
        import mypyc  # noqa: F401
    except ImportError:
        sys.exit("bench_compiled_records: mypyc is not installed (pip install mypy)")
    with tempfile.TemporaryDirectory() as tmp:
        sources = {
            "attrs_c": _attrs_module("@attrs.frozen(cache_hash=True)", "import attrs"),
            "attrsnative_c": _attrs_module("@attr.s(frozen=True, auto_attribs=True)", "import attr"),
            "plain_i": _plain_module(),
            "plain_c": _plain_module(),
        }
        for name, src in sources.items():
            with open(os.path.join(tmp, f"{name}.py"), "w") as f:
                f.write(src)
        compiled = [f"{n}.py" for n in sources if n.endswith("_c")]
        res = subprocess.run([sys.executable, "-m", "mypyc", *compiled], cwd=tmp,
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"bench_compiled_records: mypyc failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
        sys.path.insert(0, tmp)
        rows = [("model (PrefillReq, state.replace)", "interpreted", _time(_model_work, args.n, args.repeat))]
        # how mypyc compiles each (its documentation, "Native classes": a class
        # decorator other than dataclass / attr.s makes a class non-native)
        for label, mod, how in (("attrs.frozen(cache_hash=True)", "attrs_c", "mypyc, not native"),
                                ("attr.s(frozen=True)", "attrsnative_c", "mypyc, native class"),
                                ("plain slotted class", "plain_i", "interpreted"),
                                ("plain class", "plain_c", "mypyc, native class")):
            m = importlib.import_module(mod)
            assert m.__file__.endswith(".so") == (how != "interpreted"), m.__file__
            try:
                rows.append((label, how, _time(m.work, args.n, args.repeat)))
            except Exception as e:  # attrs' __init__ on a native class
                rows.append((label, how, f"fails: {type(e).__name__}: {e}"))
    base = rows[0][2]
    print("| record | how | µs per unit | against the model |" if args.markdown else
          f"{'record':36} {'how':24} {'µs/unit':>10} {'vs model':>9}")
    if args.markdown:
        print("|---|---|---:|---:|")
    for label, how, t in rows:
        ratio = f"{base / t:.2f}x" if isinstance(t, float) else ""
        t = f"{t:.2f}" if isinstance(t, float) else t
        print(f"| {label} | {how} | {t} | {ratio} |" if args.markdown else
              f"{label:36} {how:24} {t:>10} {ratio:>9}")


if __name__ == "__main__":
    main()
