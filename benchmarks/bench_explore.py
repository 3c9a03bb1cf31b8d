"""Benchmark: exhaust scenarios on every release; distinct states, states/s,
wall time and peak RSS.

Each (scenario, release) runs in its own process so that peak RSS
(``ru_maxrss``) belongs to that run alone.  Usage::

    python benchmarks/bench_explore.py                 # the default scenario
    python benchmarks/bench_explore.py --scenario all  # every built-in scenario
    python benchmarks/bench_explore.py --markdown      # a table for notes/performance.md
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time


def one(release: str, scenario_name: str, graph: bool, liveness: bool = True) -> dict:
    from reqmodel.engines import exhaustive as explore
    from reqmodel.model import properties
    from reqmodel.model import releases
    from reqmodel.model import scenario
    sc = scenario.builtin(scenario_name)
    t0 = time.perf_counter()
    props = [p for p in properties.select([]) if liveness or not p.kind.on_graph]
    ex = explore.explore(releases.get(release), sc, props, stop_early=False, keep_graph=graph)
    wall = time.perf_counter() - t0
    return {"scenario": scenario_name, "release": release, "states": ex.states,
            "edges": ex.edges, "depth": ex.depth, "seconds": round(wall, 3),
            "states_per_s": round(ex.states / wall) if wall else None,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "graph": graph, "liveness": liveness}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="incident", help="a built-in name or 'all'")
    ap.add_argument("--release", default="all")
    ap.add_argument("--no-graph", action="store_true", help="do not build the networkx graph")
    ap.add_argument("--no-liveness", action="store_true",
                    help="leave out the liveness properties (and the edges they need)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("RELEASE", "SCENARIO"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], not args.no_graph,
                             not args.no_liveness)))
        return
    from reqmodel.model import releases
    from reqmodel.model import scenario
    names = scenario.builtin_names() if args.scenario == "all" else [args.scenario]
    rels = list(releases.RELEASES) if args.release == "all" else args.release.split(",")
    rows = []
    for name in names:
        for rel in rels:
            cmd = [sys.executable, __file__, "--one", rel, name]
            if args.no_graph:
                cmd.append("--no-graph")
            if args.no_liveness:
                cmd.append("--no-liveness")
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout)
            rows.append(row)
            if not args.markdown:
                print(json.dumps(row), flush=True)
    if args.markdown:
        print(f"Machine: {platform.machine()}, Python {platform.python_version()}, "
              f"graph {'off' if args.no_graph else 'on'}\n")
        print("| scenario | release | distinct states | edges | depth | wall s | states/s | peak RSS MB |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['scenario']} | {r['release']} | {r['states']:,} | {r['edges']:,} | "
                  f"{r['depth']} | {r['seconds']:.2f} | {r['states_per_s']:,} | {r['peak_rss_mb']} |")
        total = sum(r["seconds"] for r in rows if r["scenario"] == "incident")
        if total:
            print(f"\nDefault scenario (incident), all releases: {total:.2f} s in total.")


if __name__ == "__main__":
    main()
