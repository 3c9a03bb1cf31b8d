"""Benchmark: the Z3 engine against the exhaustive one, per scenario and release.

For each (scenario, release): ``reqmodel.bmc.run`` on every applicable
property up to ``--depth``, and the breadth-first explorer on the same
scenario.  Reports wall time, learned clauses, refinements (sequences Z3
found into states with a path not learned yet), peak RSS, and whether the
verdicts agree: a violation (or reach) of length k <= depth must be found by
Z3 at depth k, and everything else must hold to the depth.  Each pair runs in
its own process.  Usage::

    python benchmarks/bench_z3.py --depth 8                      # incident
    python benchmarks/bench_z3.py --scenario all --depth 6 --markdown
    python benchmarks/bench_z3.py --scenario incident --release 0.5.19 --depth 16 --log
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(release: str, scenario_name: str, depth: int, log: bool, seconds=None) -> dict:
    from reqmodel.engines.z3 import bmc
    from reqmodel.engines import exhaustive as explore
    from reqmodel.model import properties
    from reqmodel.model import releases
    from reqmodel.model import scenario
    rel, sc = releases.get(release), scenario.builtin(scenario_name)
    props = [p for p in properties.CATALOG.values() if p.applies(rel, sc)]
    t0 = time.perf_counter()

    def show(k, n, c, answered):
        if log:
            print(f"  depth {k}: {n} refinements, {c} clauses, {answered} answered, "
                  f"{time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)

    res = bmc.run(rel, sc, props, depth, log=show, seconds=seconds)
    wall = time.perf_counter() - t0
    ex = explore.explore(rel, sc, props, stop_early=False, keep_graph=False)
    disagree = []
    for p in props:
        v = ex.verdicts[p.name]
        n = v.trace_length
        want = (("reached" if p.kind == "sometimes" else "violated", n)
                if v.trace is not None and n <= depth
                else ("unreached-to-depth" if p.kind == "sometimes" else "holds-to-depth", depth))
        got = (res[p.name].verdict, res[p.name].depth)
        if got[0] in ("proved", "unreachable"):
            # no simple path of that many steps: the exploration is shallower,
            # and its verdict is the same
            if ex.depth < got[1] and v.verdict == ("violated" if p.kind == "sometimes" else "holds"):
                continue
        elif seconds is not None and got[0].endswith("-to-depth"):
            searched = got[1]
            if not (v.trace is not None and n <= searched):
                continue
        if got != want:
            disagree.append(f"{p.name}: z3 {got}, exhaustive {want}")
    found = sorted((r.depth, r.property, round(r.seconds, 1)) for r in res.values()
                   if r.trace is not None)
    proved = [r.depth for r in res.values() if r.verdict in ("proved", "unreachable")]
    searched = max([r.depth for r in res.values() if r.verdict.endswith("-to-depth")] + [0])
    return {"scenario": scenario_name, "release": release, "depth": depth,
            "searched": searched, "proved_at": proved[0] if proved else None,
            "seconds": round(wall, 2), "clauses": max(r.clauses for r in res.values()),
            "refinements": max(r.refinements for r in res.values()),
            "found": found, "disagree": disagree,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="incident", help="a built-in name or 'all'")
    ap.add_argument("--release", default="all")
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--log", action="store_true", help="show progress per depth")
    ap.add_argument("--seconds", type=float, default=None,
                    help="stop deepening after this long (the depth reached is reported)")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.depth, args.log, args.seconds)))
        return
    from reqmodel.model import releases
    from reqmodel.model import scenario
    scs = scenario.builtin_names() if args.scenario == "all" else [args.scenario]
    rels = [r.name for r in releases.resolve(args.release)]
    rows = []
    for sc in scs:
        for rel in rels:
            cmd = [sys.executable, __file__, "--depth", str(args.depth), "--one", rel, sc]
            if args.seconds is not None:
                cmd += ["--seconds", str(args.seconds)]
            if args.log:
                cmd.append("--log")
            out = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            if not args.markdown:
                print(json.dumps(row), flush=True)
    if args.markdown:
        print("| scenario | release | searched to | proved at | wall s | clauses | refinements | found (depth) | agrees | peak RSS MB |")
        print("|---|---|---:|---:|---:|---:|---:|---|---|---:|")
        for r in rows:
            found = ", ".join(f"{p} {d} ({s} s)" for d, p, s in r["found"]) or "-"
            print(f"| {r['scenario']} | {r['release']} | {r['searched'] or '-'} | "
                  f"{r['proved_at'] or '-'} | {r['seconds']:,} | "
                  f"{r['clauses']:,} | {r['refinements']:,} | {found} | "
                  f"{'yes' if not r['disagree'] else '; '.join(r['disagree'])} | {r['peak_rss_mb']} |")


if __name__ == "__main__":
    main()
