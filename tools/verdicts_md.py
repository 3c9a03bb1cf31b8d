"""Render the full verdict table (every built-in scenario, release and
property) as Markdown for notes/verdicts.md, from one exhaustive run.

    python tools/verdicts_md.py                   # every built-in scenario
    python tools/verdicts_md.py transfer-failure  # the rows of some of them
    python tools/verdicts_md.py --from check.json # from a saved
        # `reqmodel check --release all --scenario all --json` run
"""
import json
import sys
from types import SimpleNamespace

from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.engines.base import Exhaustive, run

SHORT = {"holds": "H", "violated": "F", "not-applicable": "n/a"}


def _results(names, saved):
    if saved is None:
        rels = list(releases.RELEASES.values())
        props = properties.select([])
        for name in names:
            yield name, run(Exhaustive(), rels, [scenario.builtin(name)], props, out=None)
        return
    by = {}
    for r in json.loads(open(saved).read())["results"]:
        by.setdefault(r["scenario"], []).append(SimpleNamespace(**r))
    for name in names:
        yield name, by[name]


def main(argv) -> None:
    saved = None
    if argv[:1] == ["--from"]:
        saved, argv = argv[1], argv[2:]
    rels = list(releases.RELEASES.values())
    props = properties.select([])
    print("| scenario | property | " + " | ".join(r.name for r in rels) + " |")
    print("|---|---|" + "---|" * len(rels))
    for name, results in _results(argv or scenario.builtin_names(), saved):
        for p in props:
            cells = []
            for r in rels:
                res = next(x for x in results if x.release == r.name and x.property == p.name)
                if p.kind == "sometimes":
                    c = {"holds": f"reach {res.trace_length}", "violated": "**unreachable**",
                         "not-applicable": "n/a"}[res.verdict]
                else:
                    c = SHORT[res.verdict]
                    if res.verdict == "violated":
                        c = f"**F {res.trace_length}**"
                cells.append(c)
            print(f"| {name} | `{p.name}` | " + " | ".join(cells) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
