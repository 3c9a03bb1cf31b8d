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
    assert (not p.holds_in(states[-1])
            or not p.holds_on(states[-2], steps[-1], events[-1], states[-1]))
