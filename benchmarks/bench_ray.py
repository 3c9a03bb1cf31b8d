"""Benchmark: the exhaustive search on a local Ray instance (``--ray local``)
against one process and against forked worker processes (``--workers``):
wall seconds, the actors' peak memory and what they sent each other per
state (pickled bytes and states), with the answer checked equal.

    python benchmarks/bench_ray.py --scenario prefill-tp,optimistic-abort-unit --release 0.5.19

Measured in notes/performance.md ("The search on a Ray cluster")."""
from __future__ import annotations

import argparse
import resource
import time

from reqmodel.engines import exhaustive, raycluster
from reqmodel.model import properties, releases, scenario


def run(rel, sc, props, **kw):
    t0 = time.perf_counter()
    ex = exhaustive.explore(releases.get(rel), scenario.builtin(sc), props, stop_early=False,
                            keep_graph=False, **kw)
    return ex, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="prefill-tp,optimistic-abort-unit")
    ap.add_argument("--release", default="0.5.19")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    props = properties.select([])
    raycluster.connect("local")
    print("| scenario | release | states | one process s | forked workers s | Ray actors s "
          "| actor peak RSS MB | bytes sent a state | states sent a state | same answer |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for sc in args.scenario.split(","):
        for rel in args.release.split(","):
            one, t1 = run(rel, sc, props)
            _, tw = run(rel, sc, props, workers=args.workers)
            actors = raycluster.Actors("local", measure=True)
            r, tr = run(rel, sc, props, workers=args.workers, ray=actors)
            usage = actors.usage
            same = ({k: (v.verdict, v.trace and v.trace.steps) for k, v in one.verdicts.items()}
                    == {k: (v.verdict, v.trace and v.trace.steps) for k, v in r.verdicts.items()}
                    and one.states == r.states and one.edges == r.edges)
            sent = sum(u["sent_bytes"] for u in usage)
            sent_states = sum(u["sent_states"] for u in usage)
            print(f"| {sc} | {rel} | {one.states:,} | {t1:.1f} | {tw:.1f} | {tr:.1f} "
                  f"| {max(u['peak_rss_kb'] for u in usage) / 1024:.0f} "
                  f"| {sent / one.states:.0f} | {sent_states / one.states:.2f} "
                  f"| {'yes' if same else 'NO'} |", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"\nthis process's peak RSS {peak} MB")


if __name__ == "__main__":
    main()
