"""Write the corpus table of notes/conformance.md ("Every corpus trace on
the real code"): every trace of counterexamples/ replayed with `reqmodel
conform --trace` on the real code of its own release, one row each, and a
count per release and outcome. Needs the conformance environment; the
conformance suite checks the table against its own replay of the corpus.

    python tools/trace_table.py
"""
import collections
import glob
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

START, END = "<!-- trace-table:start -->", "<!-- trace-table:end -->"
NOTES = ROOT / "notes/conformance.md"


def outcome(r) -> str:
    d = r.divergence
    if r.reproduced:
        return "reproduced"
    if d["why"] == "not-driven":
        what = d["action"] or d["detail"].replace("the rig does not stand for ", "")
        return "not driven: " + what.replace(" yet", "")
    if d["why"] == "unread":
        return "all steps agree; violation not read on the real objects"
    return f"departs: {d['why']} at {d.get('action')}"


def table(results) -> str:
    counts = collections.Counter((r.release, outcome(r)) for r in results)
    rels = sorted({r.release for r in results})
    kinds = sorted({k for _, k in counts}, key=lambda k: (k != "reproduced", k))
    out = ["| outcome | " + " | ".join(rels) + " | all |", "|---|" + "---:|" * (len(rels) + 1)]
    for k in kinds:
        row = [counts[(rel, k)] for rel in rels]
        out.append(f"| {k} | " + " | ".join(str(n) for n in row) + f" | {sum(row)} |")
    total = [sum(counts[(rel, k)] for k in kinds) for rel in rels]
    out.append("| **traces** | " + " | ".join(str(n) for n in total) + f" | {sum(total)} |")
    out += ["", "| release | trace | steps | agreed | outcome |", "|---|---|---:|---:|---|"]
    for r in sorted(results, key=lambda r: (r.release, r.trace)):
        out.append(f"| {r.release} | {pathlib.Path(r.trace).name} | {r.steps} | {r.replayed} "
                   f"| {outcome(r)} |")
    return "\n".join(out)


def section(text: str) -> str:
    return text[text.index(START) + len(START):text.index(END)].strip()


def splice(text: str, body: str) -> str:
    return text[:text.index(START) + len(START)] + "\n" + body + "\n" + text[text.index(END):]


def main() -> None:
    from reqmodel import conform
    from reqmodel.conform import traces
    paths = sorted(glob.glob("counterexamples/0.5.*/*.itf.json", root_dir=ROOT))
    results = traces.run(conform.DEFAULT_DIR, [str(ROOT / p) for p in paths])
    text = NOTES.read_text()
    NOTES.write_text(splice(text, table(results)))
    counts = collections.Counter(outcome(r) for r in results)
    print(f"{len(results)} traces: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))


if __name__ == "__main__":
    main()
