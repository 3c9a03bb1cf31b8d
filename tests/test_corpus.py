"""The committed counterexamples replay, step by step, to their violation."""
import pathlib

import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.traces import itf
from reqmodel.proposals import mutants
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario

CORPUS = sorted((pathlib.Path(__file__).parent.parent / "counterexamples").glob("*/*.itf.json"))


def test_corpus_is_not_empty():
    assert len(CORPUS) >= 10
    assert any(p.name == "no-foreign-kv-read-incident.itf.json" and p.parent.name == "0.5.19"
               for p in CORPUS)


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_trace_replays_to_its_violation(path):
    meta, steps = itf.read(path)
    assert meta["release"] == path.parent.name
    assert path.name == f"{meta['property']}-{meta['scenario']}.itf.json"
    rel = releases.get(meta["release"])
    sc = scenario.from_dict(meta["scenario_config"])
    assert sc == scenario.builtin(meta["scenario"]), "scenario changed since the trace was written"
    states, events, disabled = explore.replay(rel, sc, steps)
    assert disabled is None, f"step {disabled} ({steps[disabled]}) is no longer enabled"
    p = properties.CATALOG[meta["property"]]
    if p.kind.on_graph:  # the request waits at the end, or the lasso closes fairly
        from reqmodel.traces import replay
        assert replay.run(replay.load(path)).violated
        return
    assert (not p.holds_in(states[-1])
            or not p.holds_on(states[-2], steps[-1], events[-1], states[-1]))


MUTANT_CORPUS = sorted((pathlib.Path(__file__).parent.parent / "counterexamples" / "mutants")
                       .glob("*/*.itf.json"))


def test_every_violated_mutant_cell_has_its_trace():
    """`python tools/mutant_traces.py` writes them: the evidence that a
    property which holds on every release can still fail."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "properties"))
    from verdict_table import MUTANT_CELLS
    want = {f"{m}/{p}-{s}.itf.json" for (m, p, s), c in MUTANT_CELLS.items() if c == "F"}
    have = {f"{path.parent.name}/{path.name}" for path in MUTANT_CORPUS}
    assert want == have


@pytest.mark.parametrize("path", MUTANT_CORPUS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_mutant_trace_replays_to_its_violation(path):
    from reqmodel.traces import replay
    loaded = replay.load(path)
    assert loaded.release is mutants.MUTANTS[path.parent.name]
    out = replay.run(loaded)
    assert out.first_disabled_step is None and out.violated
