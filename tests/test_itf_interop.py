"""Every corpus file read by an independent ITF reader (itf-py, from PyPI):
the values round-trip, and they say what the model's own states say."""
import json
import pathlib

import pytest

itf_py = pytest.importorskip("itf_py")

from reqmodel.traces import replay

CORPUS = sorted((pathlib.Path(__file__).parent.parent / "counterexamples").glob("*/*.itf.json"))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_file_round_trips_through_itf_py(path):
    raw = json.loads(path.read_text())
    trace = itf_py.trace_from_json(raw)
    assert trace.vars == raw["vars"]
    assert len(trace.states) == len(raw["states"])
    for st, raw_st in zip(trace.states, raw["states"]):
        for var in raw["vars"]:
            assert itf_py.value_to_json(st.values[var]) == raw_st[var], var
    # the independent decoding agrees with the model's replayed states
    loaded = replay.load(path)
    outcome = replay.run(loaded)
    for st, model_state in zip(trace.states, outcome.states):
        for r, req in enumerate(model_state.p):
            assert st.values["p"][r].stage == req.stage.name
            assert st.values["p"][r].origin_pages == req.origin_pages
        for i, page in enumerate(model_state.d_pages):
            writer = st.values["d_pages"][i].writer
            assert writer == (frozenset() if page.writer is None else frozenset({page.writer}))
