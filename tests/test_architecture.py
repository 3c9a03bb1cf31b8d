"""The package layout holds: the model imports no engine, its modules stay
small, and every engine answers through the one interface."""
import ast
import pathlib

import pytest

import reqmodel
from reqmodel.engines.base import ENGINES, Answer, Result, run
from reqmodel.model import properties, releases, scenario

ROOT = pathlib.Path(reqmodel.__file__).parent
MODEL = sorted((ROOT / "model").rglob("*.py"))
OUTSIDE_THE_MODEL = ("reqmodel.engines", "reqmodel.traces", "reqmodel.proposals", "reqmodel.cli",
                     "reqmodel.conform", "reqmodel.audit")


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            yield node.module or ""
            for a in node.names:
                yield f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name


@pytest.mark.parametrize("path", MODEL, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_model_imports_no_engine(path):
    """Engines, traces, proposals, the CLI and conformance consume the model;
    nothing in the model reaches back (also not inside a function)."""
    bad = [m for m in _imports(path) if m.startswith(OUTSIDE_THE_MODEL)]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", MODEL, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_model_module_is_over_600_lines(path):
    assert len(path.read_text().splitlines()) <= 600


def test_the_import_check_finds_an_engine_import(tmp_path):
    """The check above can fail."""
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from reqmodel.engines import exhaustive\n")
    assert any(m.startswith(OUTSIDE_THE_MODEL) for m in _imports(p))


def test_every_engine_answers_in_the_one_vocabulary():
    """Exhaustive search, Hypothesis and Z3, through the one table, on a
    scenario each of them decides: the same verdict on every property."""
    rel, sc = releases.get("0.5.21"), scenario.builtin("both-reject")
    props = properties.select([])
    options = {"exhaustive": {}, "hypothesis": {"profile": "dev"}, "z3": {"depth": 8}}
    assert set(options) == set(ENGINES)
    answers = {}
    for name, cls in ENGINES.items():
        engine = cls(**options[name])
        assert engine.name == name
        results = engine.check(rel, sc, props)
        assert [r.property for r in results] == [p.name for p in props]
        assert all(isinstance(r, Result) and isinstance(r.verdict, Answer) for r in results)
        # a liveness property needs the whole graph: only the exhaustive engine
        # decides it here (the others say why, tests/test_liveness.py)
        answers[name] = {r.property: r.verdict for r in results if not r.kind.on_graph}
        if name != "exhaustive":
            applies = {p.name: p.applies(rel, sc) for p in props}
            assert all((r.verdict == Answer.NOT_CHECKED and r.note and applies[r.property])
                       or (r.verdict == Answer.NOT_APPLICABLE and not applies[r.property])
                       for r in results if r.kind.on_graph)
    assert answers["exhaustive"] == answers["hypothesis"] == answers["z3"]


def test_run_writes_only_violations_under_out(tmp_path):
    results = run(ENGINES["exhaustive"](), [releases.get("0.5.19")], [scenario.builtin("incident")],
                  properties.select(["no-foreign-kv-read", "valid-request-completes"]), tmp_path)
    by = {r.property: r for r in results}
    assert by["no-foreign-kv-read"].verdict == Answer.VIOLATED
    assert pathlib.Path(by["no-foreign-kv-read"].trace_file).is_file()
    assert by["valid-request-completes"].trace_file is None
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == ["no-foreign-kv-read-incident.itf.json"]


def test_property_kinds_are_an_enum():
    kinds = {p.kind for p in properties.CATALOG.values()}
    assert kinds == set(properties.Kind)
    with pytest.raises(ValueError):
        properties.Property(name="x", kind="never", ref="", text="")


def test_one_encoder_per_adapter_seam():
    """Conformance encodes cases through a table keyed like the adapter's
    seams, and every seam action names one of them in @action(seam=...)."""
    import ast
    import pathlib
    from reqmodel.conform import cases as cases_mod
    from reqmodel.model import actions
    src = (pathlib.Path(cases_mod.__file__).parent / "adapter.py").read_text()
    seams = next(node for node in ast.parse(src).body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SEAMS")
    adapter_seams = {k.value for k in seams.value.keys}
    step_seams = set(cases_mod.ENCODERS)
    assert step_seams <= adapter_seams
    assert {a.seam for a in actions.ACTIONS if a.seam} == step_seams
    assert cases_mod.SEAMS == {a.name: a.seam for a in actions.ACTIONS if a.seam}


def test_message_kinds_are_a_closed_vocabulary():
    from reqmodel.model.state import Msg, MsgKind
    m = Msg("metadata", 0)
    assert m.kind is MsgKind.metadata and m.kind == "metadata"
    assert repr(m.kind) == "'metadata'"  # symmetry orders states by repr
    with pytest.raises(ValueError):
        Msg("teleport", 0)


def test_a_proposal_written_for_the_old_import_path_still_loads(tmp_path):
    """reqmodel.proposal is kept as an alias of the proposal API."""
    from reqmodel.proposals import proposal
    p = tmp_path / "old-style.py"
    p.write_text("from reqmodel.proposal import RETIRE_CLEANUP_FULL, is_unadmitted_reject\n"
                 "base = '0.5.20'\nretire_cleanup = RETIRE_CLEANUP_FULL\n"
                 "def prefill_door(req):\n    return is_unadmitted_reject(req)\n")
    loaded = proposal.load(str(p))
    assert loaded.base.name == "0.5.20" and "prefill_door" in loaded.replaced


def test_every_model_module_imports_first_in_a_fresh_interpreter():
    """A user's first import can be any module (``from reqmodel.model import
    scenario`` once failed on a circular import that an earlier import of
    ``releases`` hid in every test)."""
    import subprocess
    import sys
    names = sorted({".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
                    for p in MODEL if p.name != "__init__.py"})
    code = ("import importlib, sys\n"
            "for n in sys.argv[1:]:\n"
            "    for m in [k for k in sys.modules if k.startswith('reqmodel')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(n)\n")
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
