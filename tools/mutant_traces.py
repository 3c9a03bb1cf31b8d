"""Write the counterexample of every violated mutant cell of
properties/verdict_table.py (``MUTANT_CELLS``) under
counterexamples/mutants/<mutant>/: the committed evidence that a property
which holds on every release can still fail.

    python tools/mutant_traces.py
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "properties"))

from verdict_table import MUTANT_CELLS  # noqa: E402

from reqmodel.engines.exhaustive import explore  # noqa: E402
from reqmodel.model import properties, scenario  # noqa: E402
from reqmodel.proposals import mutants  # noqa: E402
from reqmodel.traces import itf  # noqa: E402


def main() -> None:
    out = ROOT / "counterexamples" / "mutants"
    for (mutant, prop, sc), cell in sorted(MUTANT_CELLS.items()):
        if cell != "F":
            continue
        p = properties.CATALOG[prop]
        scen = scenario.builtin(sc)
        v = explore(mutants.MUTANTS[mutant], scen, [p], keep_graph=False).verdicts[prop]
        assert v.verdict == "violated", (mutant, prop, sc)
        path = out / mutant / f"{prop}-{sc}.itf.json"
        itf.write(path, v.trace, scen)
        print(f"{path.relative_to(ROOT)}: {len(v.trace)} steps")


if __name__ == "__main__":
    main()
