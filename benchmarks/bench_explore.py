"""Benchmark: exhaust scenarios on every release; distinct states, states per
CPU second, wall time and peak RSS, optionally side by side with an earlier
revision of the engine.

Each (scenario, release) runs in its own process so that peak RSS
(``ru_maxrss``) belongs to that run alone.  Usage::

    python benchmarks/bench_explore.py                 # the default scenario
    python benchmarks/bench_explore.py --scenario all  # every built-in scenario
    python benchmarks/bench_explore.py --markdown      # a table for notes/performance.md
    # today's engine against revision REV, in the same run, on the same machine:
    python benchmarks/bench_explore.py --scenario optimistic-abort-unit,prefill-tp \\
        --release 0.5.19 --baseline REV --repeat 3 --markdown
    # one process against N worker processes (engines.parallel), wall time:
    python benchmarks/bench_explore.py --scenario optimistic-abort-unit --release 0.5.19 \\
        --workers 2 --repeat 3 --markdown
    # scenario files exhausted whatever their size, the visited set as fingerprints
    # (#27's: benchmarks/scenarios/), with what each cell found:
    python benchmarks/bench_explore.py --scenario-file benchmarks/scenarios/reentry-two-unit.toml \
        --fingerprints --markdown

With ``--baseline`` the revision is checked out into a temporary directory
(``git archive``) and each run alternates between the two trees, so that the
machine's load falls on both alike; the rows say whether the two found the
same states, edges and verdicts.  With ``--workers N`` each cell runs in one
process and over N workers, alternating; the graph is off (the parallel
engine keeps none), CPU time includes the workers', and the rows give the
wall-time speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def one(release: str, scenario_name: str, graph: bool, liveness: bool = True,
        workers: int = 1, fingerprints: bool = False) -> dict:
    """One exhausted cell; ``scenario_name`` is a built-in name or a TOML file."""
    from reqmodel.engines import exhaustive as explore
    from reqmodel.model import properties
    from reqmodel.model import releases
    from reqmodel.model import scenario
    more = {"workers": workers} if workers > 1 else {}  # a baseline may not know the option
    if scenario_name.endswith(".toml"):  # within the engine's hard bounds, as the CLI loads it
        sc = scenario.load_file(scenario_name)
        more["max_states"] = 10**9  # a file is here to be exhausted
    else:
        sc = scenario.builtin(scenario_name)
    t0, c0 = time.perf_counter(), time.process_time()
    props = [p for p in properties.select([]) if liveness or not p.kind.on_graph]
    if fingerprints:  # the liveness properties in their deadlock forms, as the CLI checks them
        from reqmodel.engines.base import without_graph
        props = without_graph(releases.get(release), sc, props)
        more["fingerprints"] = True
    ex = explore.explore(releases.get(release), sc, props, stop_early=False, keep_graph=graph,
                         **more)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + children.ru_utime + children.ru_stime
    verdicts = {n: [v.verdict, v.trace_length] for n, v in sorted(ex.verdicts.items())}
    return {"scenario": sc.name, "release": release, "states": ex.states,
            "edges": ex.edges, "depth": ex.depth, "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3),
            "states_per_s": round(ex.states / wall) if wall else None,
            "states_per_cpu_s": round(ex.states / cpu) if cpu else None,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "workers_peak_rss_mb": round(children.ru_maxrss / 1024, 1) if workers > 1 else None,
            "graph": graph, "liveness": liveness, "workers": workers,
            "fingerprints": fingerprints, "verdicts": verdicts}


def _run(tree: str, rel: str, name: str, args, workers: int = 1) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "bench_explore.py"), "--one", rel, name,
           "--workers", str(workers)]
    if not _graph(args):
        cmd.append("--no-graph")
    if args.no_liveness:
        cmd.append("--no-liveness")
    if args.fingerprints:
        cmd.append("--fingerprints")
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tree, env=env)
    return json.loads(out.stdout)


def _graph(args) -> bool:
    """Whether the runs keep the networkx graph: neither the parallel engine
    nor the fingerprint mode keeps one."""
    return not (args.no_graph or args.workers > 1 or args.fingerprints)


def _checkout(rev: str) -> str:
    """The tree of ``rev`` in a temporary directory (its own reqmodel package,
    put first on the path of the runs that measure it)."""
    tmp = tempfile.mkdtemp(prefix="reqmodel-baseline-")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
    return tmp


def _best(rows):
    """The run with the least CPU time (the least disturbed by the machine)."""
    return min(rows, key=lambda r: r["cpu_seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="incident",
                    help="a built-in name, a comma list of them, or 'all'")
    ap.add_argument("--release", default="all", help="a release, a comma list, or 'all'")
    ap.add_argument("--no-graph", action="store_true", help="do not build the networkx graph")
    ap.add_argument("--no-liveness", action="store_true",
                    help="leave out the liveness properties (and the edges they need)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also measure the engine of git revision REV, alternating runs")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per tree and cell; the least CPU time is reported")
    ap.add_argument("--workers", type=int, default=1,
                    help="also run each cell over this many worker processes, alternating")
    ap.add_argument("--scenario-file", action="append", default=[], metavar="PATH",
                    help="a scenario TOML file to exhaust, whatever its size (repeatable; "
                    "benchmarks/scenarios/ holds #27's); replaces --scenario")
    ap.add_argument("--fingerprints", action="store_true",
                    help="keep the visited set as fingerprints (one process; the liveness "
                    "properties in their deadlock forms)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("RELEASE", "SCENARIO"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], not args.no_graph,
                             not args.no_liveness, args.workers, args.fingerprints)))
        return
    sys.path.insert(0, ROOT)
    from reqmodel.model import releases
    from reqmodel.model import scenario
    names = scenario.builtin_names() if args.scenario == "all" else args.scenario.split(",")
    if args.scenario_file:
        names = [os.path.abspath(f) for f in args.scenario_file]
    if args.fingerprints and args.workers > 1:
        ap.error("--fingerprints runs in one process: drop --workers")
    rels = list(releases.RELEASES) if args.release == "all" else args.release.split(",")
    if args.baseline and args.workers > 1:
        ap.error("--baseline and --workers measure different things: give one")
    base = _checkout(args.baseline) if args.baseline else None
    try:
        rows = _measure(names, rels, base, args)
    finally:
        if base:
            shutil.rmtree(base, ignore_errors=True)
    if args.markdown:
        _markdown(rows, base, args)


def _measure(names, rels, base, args):
    rows = []
    for name in names:
        for rel in rels:
            now, before, par = [], [], []
            for _ in range(args.repeat):
                now.append(_run(ROOT, rel, name, args))
                if base:
                    before.append(_run(base, rel, name, args))
                if args.workers > 1:
                    par.append(_run(ROOT, rel, name, args, args.workers))
            row = _best(now)
            if par:
                p = min(par, key=lambda r: r["seconds"])
                row["seconds"] = min(r["seconds"] for r in now)
                row["parallel"] = {k: p[k] for k in ("seconds", "cpu_seconds", "peak_rss_mb",
                                                     "workers_peak_rss_mb")}
                row["same"] = all(p[k] == row[k] for k in ("states", "edges", "depth", "verdicts"))
                row["speedup"] = round(row["seconds"] / p["seconds"], 2)
            if base:
                b = _best(before)
                row["baseline"] = {k: b[k] for k in ("states", "edges", "cpu_seconds",
                                                     "states_per_cpu_s", "peak_rss_mb")}
                row["same"] = all(b[k] == row[k] for k in ("states", "edges", "depth", "verdicts"))
                # distinct states per CPU second, now against before (issue #27's
                # measure): the CPU-time ratio when both explore the same states,
                # not when the model changed in between (bf83ff0 explores more)
                row["speedup"] = round((row["states"] / row["cpu_seconds"])
                                       / (b["states"] / b["cpu_seconds"]), 2)
            rows.append(row)
            if not args.markdown:
                print(json.dumps({k: v for k, v in row.items() if k != "verdicts"}), flush=True)
    return rows


def _markdown(rows, base, args) -> None:
    live = "off" if args.no_liveness else "deadlock forms" if args.fingerprints else "on"
    print(f"Machine: {platform.machine()}, Python {platform.python_version()}, "
          f"graph {'on' if _graph(args) else 'off'}, "
          f"liveness {live}"
          f"{', fingerprints' if args.fingerprints else ''}, best of {args.repeat}\n")
    if args.workers > 1:
        print(f"| scenario | release | distinct states | wall s (1 process) | "
              f"wall s ({args.workers} workers) | wall speed-up | CPU s (1 / {args.workers}) | "
              "same states, edges, verdicts | peak RSS MB (1 / coordinator / a worker) |")
        print("|---|---|---:|---:|---:|---:|---:|---|---:|")
        for r in rows:
            p = r["parallel"]
            print(f"| {r['scenario']} | {r['release']} | {r['states']:,} | {r['seconds']:.2f} | "
                  f"{p['seconds']:.2f} | {r['speedup']}x | {r['cpu_seconds']:.1f} / "
                  f"{p['cpu_seconds']:.1f} | {'yes' if r['same'] else 'NO'} | "
                  f"{r['peak_rss_mb']} / {p['peak_rss_mb']} / {p['workers_peak_rss_mb']} |")
    elif base:
        print(f"| scenario | release | distinct states | edges | states/CPU s ({args.baseline}) "
              "| states/CPU s (now) | speed-up (states/CPU s) | same states, edges, verdicts | "
              "peak RSS MB (before / now) |")
        print("|---|---|---:|---:|---:|---:|---:|---|---:|")
        for r in rows:
            b = r["baseline"]
            print(f"| {r['scenario']} | {r['release']} | {r['states']:,} | {r['edges']:,} | "
                  f"{b['states_per_cpu_s']:,} | {r['states_per_cpu_s']:,} | "
                  f"{r['speedup']}x | {'yes' if r['same'] else 'NO'} | "
                  f"{b['peak_rss_mb']} / {r['peak_rss_mb']} |")
    else:
        files = bool(args.scenario_file)  # then each row also says what it found
        print("| scenario | release | distinct states | edges | depth | wall s | CPU s | "
              "states/CPU s | peak RSS MB |" + (" violated (trace steps) |" if files else ""))
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if files else ""))
        for r in rows:
            broken = ", ".join(f"{n} ({v[1]})" for n, v in r["verdicts"].items()
                               if v[0] == "violated") or "none"
            print(f"| {r['scenario']} | {r['release']} | {r['states']:,} | {r['edges']:,} | "
                  f"{r['depth']} | {r['seconds']:.2f} | {r['cpu_seconds']:.1f} | "
                  f"{r['states_per_cpu_s']:,} | {r['peak_rss_mb']} |"
                  + (f" {broken} |" if files else ""))
        total = sum(r["seconds"] for r in rows if r["scenario"] == "incident")
        if total:
            print(f"\nDefault scenario (incident), all releases: {total:.2f} s in total.")


if __name__ == "__main__":
    main()
