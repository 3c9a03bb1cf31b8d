"""ITF export: structure, encodings, and the steps read back for replay."""
import json

import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.traces import itf
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    sc = scenario.builtin("incident")
    ex = explore.explore(releases.get("0.5.19"), sc, properties.select(["no-foreign-kv-read"]))
    t = ex.verdicts["no-foreign-kv-read"].trace
    path = tmp_path_factory.mktemp("itf") / "0.5.19" / "no-foreign-kv-read-incident.itf.json"
    itf.write(path, t, sc)
    return path, t


def _walk(value):
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


def test_itf_structure(trace_file):
    path, t = trace_file
    data = json.loads(path.read_text())
    meta = data["#meta"]
    for key in ("format", "source", "release", "scenario", "property", "engine"):
        assert key in meta
    # nothing that changes from one run to the next: the corpus is regenerated
    # into the same files
    assert "timestamp" not in meta
    assert meta["format"] == "ITF" and meta["release"] == "0.5.19"
    assert data["vars"] == list(itf.trace_vars(t.states))
    assert len(data["states"]) == len(t) + 1
    for i, st in enumerate(data["states"]):
        assert st["#meta"]["index"] == i
        assert set(data["vars"]) <= set(st)
    assert data["states"][-1]["#meta"]["violation"] == "no-foreign-kv-read"
    # no bare JSON integer anywhere: every int is a #bigint
    for node in _walk([{k: v for k, v in st.items() if k != "#meta"} for st in data["states"]]):
        for v in node.values():
            assert not (isinstance(v, int) and not isinstance(v, bool))


def test_every_state_field_is_a_trace_variable(trace_file):
    """The trace variables come from the state's own fields, so a field added
    to the state is in every trace without a list to update; a field marked
    ITF_OMIT (a prefill instance's death) only in the traces that move it."""
    import attrs
    from reqmodel.model.state import State
    path, t = trace_file
    data = json.loads(path.read_text())
    names = [f.name for f in attrs.fields(State)
             if f.name not in ("prefill_dead", "prefill_lost", "workers_dead")]
    assert data["vars"] == names  # no prefill instance or worker died, none was lost
    assert {"d_rooms", "room_slots"} <= set(names)
    for st in data["states"]:
        assert set(names) <= set(st)


def test_the_committed_corpus_records_every_state_field():
    import pathlib
    import attrs
    from reqmodel.model.state import State
    corpus = sorted((pathlib.Path(__file__).parent.parent / "counterexamples").glob("*/*.itf.json"))
    assert corpus
    fields = [f.name for f in attrs.fields(State)]
    omittable = {f.name for f in attrs.fields(State) if f.metadata.get("itf_omit_default")}
    for path in corpus:
        data = json.loads(path.read_text())
        # every field in declaration order, but one marked ITF_OMIT only in
        # the traces that move it
        assert [v for v in fields if v in data["vars"]] == data["vars"], path.name
        assert set(fields) - set(data["vars"]) <= omittable, path.name
        assert "timestamp" not in data["#meta"], path.name
        assert all(set(data["vars"]) <= set(st) for st in data["states"]), path.name


def test_two_exports_of_one_trace_are_the_same_bytes(trace_file, tmp_path):
    path, t = trace_file
    again = tmp_path / "again.itf.json"
    itf.write(again, t, scenario.builtin("incident"))
    assert again.read_bytes() == path.read_bytes()


def test_steps_round_trip(trace_file):
    path, t = trace_file
    meta, steps = itf.read(path)
    assert steps == t.steps
    sc = scenario.from_dict(meta["scenario_config"])
    states, _, disabled = explore.replay(releases.get(meta["release"]), sc, steps)
    assert disabled is None and states[-1] == t.states[-1]


@pytest.mark.parametrize("content,message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "top level is not an object"),
    ('{"vars": []}', "missing 'states'"),
    ('{"vars": [], "states": []}', "non-empty"),
    ('{"vars": [], "states": [{}, {"#meta": {"action": "teleport", "params": {"rid": {"#bigint": "0"}}}}]}',
     "unknown action 'teleport'"),
    ('{"vars": [], "states": [{}, {"#meta": {"action": "p_door", "params": {"rid": {"#bigint": "0"}, "page": 1}}}]}',
     "unknown parameter 'page'"),
    ('{"vars": [], "states": [{}, {"#meta": {"action": "p_door", "params": {}}}]}', "no 'rid'"),
])
def test_malformed_trace_files(tmp_path, content, message):
    p = tmp_path / "t.itf.json"
    p.write_text(content)
    with pytest.raises(itf.TraceFileError) as exc:
        itf.read(p)
    assert message in str(exc.value) and "\n" not in str(exc.value)
