"""Shrink quality and search power of the Hypothesis engine against the
exhaustive one, on every violated cell of the verdict table.

For each cell: does Hypothesis (profile ``ci`` by default) find it, in how many
examples (test cases), runs (of the scenario; a test case holds several) and
seconds, how long was the failing run it found, how long after
``minimise``, and the exhaustive engine's shortest length.  Usage::

    python benchmarks/bench_hypothesis.py --markdown [--profile ci] [--scenario NAME]
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "properties"))

from reqmodel.engines import exhaustive as explore
from reqmodel.engines.hypothesis import engine as hypo
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario  # noqa: E402
from verdict_table import violated_cells  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--scenario", default=None, help="only the cells of this built-in scenario")
    args = ap.parse_args()
    print("| property | scenario | release | found | examples | runs | s | run length | minimised "
          "| exhaustive |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for prop, sc_name, rel in violated_cells():
        if args.scenario and sc_name != args.scenario:
            continue
        sc = scenario.builtin(sc_name)
        p = properties.CATALOG[prop]
        ex = explore.explore(releases.get(rel), sc, [p], keep_graph=False)
        hv = hypo.check_property(releases.get(rel), sc, p, args.profile, database=False)
        found = hv.verdict.verdict == "violated"
        print(f"| `{prop}` | {sc_name} | {rel} | {'yes' if found else '**no**'} | {hv.examples} | {hv.runs} | "
              f"{hv.seconds:.1f} | {hv.shrunk_length or '—'} | {hv.verdict.trace_length or '—'} | "
              f"{ex.verdicts[prop].trace_length} |", flush=True)


if __name__ == "__main__":
    main()
