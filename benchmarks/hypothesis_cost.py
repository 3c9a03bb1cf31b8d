"""What the Hypothesis engine costs against the exhaustive one, per scenario.

For each built-in scenario: the exhaustive engine's CPU time to all its
verdicts on every release and property (one process, as ``reqmodel check``
with ``--workers 1``), against the Hypothesis engine's (profile ``ci``, as
``properties/test_hypothesis.py`` runs it, no time budget) on the cells the
exhaustive engine finds violated: how many it finds and the CPU time it
takes to them.  Sampling never concludes ``holds``: a cell without a
violation costs it the whole profile, measured on one such cell per scenario
(the last release's first one).  A scenario beyond the exhaustive bounds
(``--file``) gets the Hypothesis columns only, on every safety property and
release.  Usage::

    python benchmarks/hypothesis_cost.py --markdown [--scenario a,b] [--file x.toml ...]
"""
import argparse
import time

from reqmodel.engines.base import ENGINES, Answer
from reqmodel.model import properties, releases, scenario
from reqmodel.model.property import Kind


def _cpu(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def _hypothesis(rel, sc, prop):
    (res,), s = _cpu(lambda: ENGINES["hypothesis"](profile="ci").check(rel, sc, [prop]))
    return res.verdict == Answer.VIOLATED, s


def built_in(sc):
    props = list(properties.CATALOG.values())
    ex_s, violated, holding = 0.0, [], []
    for rel in releases.RELEASES.values():
        res, s = _cpu(lambda: ENGINES["exhaustive"](workers=1).check(rel, sc, props))
        ex_s += s
        for r in res:
            cell = (rel, properties.CATALOG[r.property])
            if r.kind == Kind.ALWAYS and r.verdict == Answer.VIOLATED:
                violated.append(cell)
            elif r.kind == Kind.ALWAYS and r.verdict == Answer.HOLDS:
                holding.append(cell)
    found, found_s = 0, 0.0
    for rel, p in violated:
        hit, s = _hypothesis(rel, sc, p)
        found += hit
        found_s += s
    one_cell = _hypothesis(holding[-1][0], sc, holding[-1][1])[1] if holding else 0.0
    return ex_s, len(violated), found, found_s, one_cell


def beyond(sc):
    hits, s_all = 0, 0.0
    for rel in releases.RELEASES.values():
        for p in properties.CATALOG.values():
            if p.kind == Kind.ALWAYS and p.applies(rel, sc):
                hit, s = _hypothesis(rel, sc, p)
                hits += hit
                s_all += s
    return hits, s_all


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=None, help="comma list of built-in scenarios")
    ap.add_argument("--file", action="append", default=[],
                    help="a scenario file beyond the exhaustive bounds (Hypothesis only)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    names = args.scenario.split(",") if args.scenario else scenario.builtin_names()
    print("| scenario | exhaustive CPU s, every cell | violated safety cells | found by "
          "Hypothesis | Hypothesis CPU s to them | ratio | Hypothesis CPU s, one cell "
          "without a violation |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        ex_s, n, found, found_s, one = built_in(scenario.builtin(name))
        ratio = f"{found_s / ex_s:.1f}x" if ex_s else "—"
        print(f"| {name} | {ex_s:.1f} | {n} | {found} | {found_s:.1f} | {ratio} | {one:.1f} |",
              flush=True)
    for f in args.file:
        sc = scenario.load_file(f, scenario.SAMPLED)
        hits, s_all = beyond(sc)
        print(f"| {sc.name} (beyond the bounds) | refused | — | {hits} violated | — | — | "
              f"{s_all:.1f} (every safety cell) |", flush=True)


if __name__ == "__main__":
    main()
