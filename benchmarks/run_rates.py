"""Per-run hit rates of the Hypothesis engine's schedules, outside Hypothesis.

The machine ``hypo.machine`` builds is driven directly: each run draws its
schedule from a seeded ``random.Random`` (as ``start`` does), then picks
uniformly among the enabled rules, requests and choices until the run can
no longer move. The rate is the share of runs in which the property is hit.
It measures the schedules (``draw_schedule``, ``enabled_map``) on their own,
without Hypothesis's draw biases or budget, so two versions of the
scheduler can be compared on the rare orderings.  Usage::

    python benchmarks/run_rates.py --runs 5000 [--seed 1] [--swarm] PROP SCENARIO RELEASE [...]
    python benchmarks/run_rates.py --missed [--swarm]   # every cell the ci profile misses

``--swarm``: swarm testing over event families: each run first switches off
each of the scenario's event families (client abort, retraction, transfer
failure, ...) with probability one half, so its events never fire in that
run, then draws its schedule as the engine does.
"""
import argparse
import random
import time

from reqmodel.engines.hypothesis import engine as hypo
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.model.actions import ACTIONS


def swarm(draw):
    """``draw_schedule`` with swarm testing over event families."""
    flag = {a.name: a.event_flag for a in ACTIONS if a.event_flag is not None}

    def drawn(rnd, sc, release=None):
        timers, rank, delayed = draw(rnd, sc, release)
        families = sorted({flag[a] for a, _ in timers})
        off = {f for f in families if rnd.random() < 0.5}
        return {k: t for k, t in timers.items() if flag[k[0]] not in off}, rank, delayed
    return drawn


def rate(prop: str, sc: str, rel: str, runs: int, seed: int):
    M = hypo.machine(releases.get(rel), scenario.builtin(sc), [properties.CATALOG[prop]])
    rules = {n: r.function for n, r in hypo.rules_of(M).items()}
    invariants = [getattr(M, n) for n in dir(M) if n.startswith(("inv_", "reach_"))]
    rnd = random.Random(seed)
    data = hypo.RandomData(rnd)
    hits = steps = 0
    for _ in range(runs):
        m = M()
        rules["start"](m, data)
        try:
            while True:
                names = m.enabled_rules()
                if names == {"start"}:
                    break
                rules[rnd.choice(sorted(names))](m, data)
                steps += 1
                for inv in invariants:
                    inv(m)
        except hypo.Violation:
            hits += 1
    return hits, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--swarm", action="store_true", help="swarm over event families")
    ap.add_argument("--missed", action="store_true",
                    help="every cell properties/test_hypothesis.py lists as missed by ci")
    ap.add_argument("cells", nargs="*", help="PROP SCENARIO RELEASE triples")
    args = ap.parse_args()
    if args.swarm:
        hypo.draw_schedule = swarm(hypo.draw_schedule)
    if args.missed:
        import pathlib
        import sys
        sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "properties"))
        from test_hypothesis import NOT_FOUND_BY_CI
        args.cells = [x for cell in sorted(NOT_FOUND_BY_CI) for x in cell]
    if len(args.cells) % 3 or not args.cells:
        ap.error("cells come in PROP SCENARIO RELEASE triples")
    print("| property | scenario | release | runs | hits | rate | steps/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for i in range(0, len(args.cells), 3):
        prop, sc, rel = args.cells[i:i + 3]
        t0 = time.perf_counter()
        hits, steps = rate(prop, sc, rel, args.runs, args.seed)
        dt = time.perf_counter() - t0
        print(f"| `{prop}` | {sc} | {rel} | {args.runs} | {hits} | {100 * hits / args.runs:.2f} % "
              f"| {steps / dt:.0f} |", flush=True)


if __name__ == "__main__":
    main()
