"""Re-pin the cells of properties/verdict_table.py from a ``reqmodel check
--release all --scenario all --json`` run, after a deliberate model change.

    python tools/pin_verdicts.py check.json            # print the changed cells
    python tools/pin_verdicts.py check.json --write    # and rewrite the file

A run of some scenarios (``--scenario a,b``) re-pins only theirs.  Only the
cell lists are rewritten; the comments beside them are not, so read
the printed changes and fix any comment that quotes a length or a verdict.
"""
import json
import re
import sys
from pathlib import Path

from reqmodel.model import properties

TABLE = Path(__file__).resolve().parent.parent / "properties" / "verdict_table.py"
SOMETIMES = {p.name for p in properties.CATALOG.values() if p.kind == "sometimes"}


def cell(res) -> str:
    if res["verdict"] == "not-applicable":
        return "-"
    if res["property"] in SOMETIMES:
        return f"R{res['trace_length']}" if res["verdict"] == "holds" else "U"
    return f"F{res['trace_length']}" if res["verdict"] == "violated" else "H"


def main(argv) -> int:
    results = json.loads(Path(argv[0]).read_text())["results"]
    by = {(r["property"], r["scenario"], r["release"]): r for r in results}
    rels = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
    text = TABLE.read_text()
    changes = []

    def cells_for(prop, sc):
        return [cell(by[(prop, sc, rel)]) for rel in rels]

    def fmt(cells):
        return "[" + ", ".join(f'"{c}"' for c in cells) + "]"

    def sub(m, prop, sc):
        if not all((prop, sc, rel) in by for rel in rels):
            return m.group(0)  # a scenario the run did not cover: left as it is
        old = re.findall(r'"([^"]*)"', m.group("cells"))
        new = cells_for(prop, sc)
        if old != new:
            changes.append(f"{prop} on {sc}: {' '.join(old)} -> {' '.join(new)}")
        return m.group("head") + fmt(new)

    # REFERENCE: "prop": ("scenario", [cells])
    text = re.sub(r'(?P<head>"(?P<p>[a-z-]+)": \("(?P<s>[a-z-]+)", )(?P<cells>\[[^\]]*\])',
                  lambda m: sub(m, m.group("p"), m.group("s")), text)
    # ESTABLISHED: ("prop", "scenario"): [cells]
    text = re.sub(r'(?P<head>\("(?P<p>[a-z-]+)", "(?P<s>[a-z-]+)"\): )(?P<cells>\[[^\]]*\])',
                  lambda m: sub(m, m.group("p"), m.group("s")), text)
    # grouped rows: **{("prop", sc): cells for sc, cells in (("scenario", [cells]), ...)}
    for block in re.finditer(r'\*\*\{\("(?P<p>[a-z-]+)", sc\): cells for sc, cells in \((?P<body>.*?)\n    \)\}',
                             text, re.S):
        prop = block.group("p")
        body = re.sub(r'(?P<head>\("(?P<s>[a-z-]+)", )(?P<cells>\[[^\]]*\])',
                      lambda m: sub(m, prop, m.group("s")), block.group("body"))
        text = text.replace(block.group("body"), body)
    # ... and by scenario: **{(prop, "scenario"): cells for prop, cells in (("prop", [cells]), ...)}
    for block in re.finditer(r'\*\*\{\(prop, "(?P<s>[a-z-]+)"\): cells for prop, cells in \((?P<body>.*?)\n    \)\}',
                             text, re.S):
        sc = block.group("s")
        body = re.sub(r'(?P<head>\("(?P<p>[a-z-]+)", )(?P<cells>\[[^\]]*\])',
                      lambda m: sub(m, m.group("p"), sc), block.group("body"))
        text = text.replace(block.group("body"), body)
    print("\n".join(changes) or "no cell changed")
    if "--write" in argv:
        TABLE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
