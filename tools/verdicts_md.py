"""Render the full verdict table (every built-in scenario, release and
property) as Markdown for notes/verdicts.md, from one exhaustive run.

    python tools/verdicts_md.py                   # every built-in scenario
    python tools/verdicts_md.py transfer-failure  # the rows of some of them
"""
import sys

from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.engines.base import Exhaustive, run

SHORT = {"holds": "H", "violated": "F", "not-applicable": "n/a"}


def main() -> None:
    rels = list(releases.RELEASES.values())
    props = properties.select([])
    print("| scenario | property | " + " | ".join(r.name for r in rels) + " |")
    print("|---|---|" + "---|" * len(rels))
    for name in sys.argv[1:] or scenario.builtin_names():
        sc = scenario.builtin(name)
        results = run(Exhaustive(), rels, [sc], props, out=None)
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
    main()
