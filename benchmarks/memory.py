"""Memory per state of the exhaustive engine: full states, fingerprints, and
the networkx graph kept.

Each search runs in its own process (peak RSS is per process): after a
tiny warm-up search, the peak resident set before the search is subtracted
from the peak after it, and divided by the distinct states. Safety and
reachability properties (the fingerprint mode checks the graph properties
only in their deadlock forms), exhausted.  Usage::

    python benchmarks/memory.py --scenario optimistic-abort-unit,room-reuse --release 0.5.19
"""
import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys
from reqmodel.engines import exhaustive as ex
from reqmodel.model import properties, releases, scenario
name, rel, mode = sys.argv[1:4]
props = [p for p in properties.CATALOG.values() if not p.kind.on_graph]
ex.explore(releases.get(rel), scenario.builtin("both-reject"), props, keep_graph=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
e = ex.explore(releases.get(rel), scenario.builtin(name), props, stop_early=False,
               keep_graph=(mode == "graph"), fingerprints=(mode == "fingerprints"))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"states": e.states, "kb": peak - base}))
"""

MODES = ("states", "fingerprints", "graph")


def measure(name: str, rel: str, mode: str):
    out = subprocess.run([sys.executable, "-c", CHILD, name, rel, mode], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="optimistic-abort-unit,room-reuse,prefill-tp")
    ap.add_argument("--release", default="0.5.19")
    args = ap.parse_args()
    print("| scenario | release | distinct states | " + " | ".join(
        f"{m}: MB, bytes/state" for m in MODES) + " |")
    print("|---|---|---:|" + "---:|" * len(MODES))
    for name in args.scenario.split(","):
        got = {m: measure(name, args.release, m) for m in MODES}
        n = got["states"]["states"]
        cells = [f"{g['kb'] / 1024:.1f}, {g['kb'] * 1024 / n:,.0f}" for g in got.values()]
        print(f"| {name} | {args.release} | {n:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
