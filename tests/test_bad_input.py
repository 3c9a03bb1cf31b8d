"""Bad input at the edge (issue #26, first part): files read as bytes and
decoded explicitly, size, depth and number limits before any parser, names
that cannot leave --out or break the terminal, messages of one short line,
and no file left by a command that is refused part-way."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCIDENT = (ROOT / "reqmodel/scenarios/incident.toml").read_text()
TRACE = ROOT / "counterexamples/0.5.19/no-foreign-kv-read-incident.itf.json"


def run(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def one_line(r, fragment):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert fragment in lines[0], lines[0]
    assert len(lines[0]) < 300, lines[0]


def files_under(path):
    return sorted(p for p in pathlib.Path(path).rglob("*") if p.is_file())


SCENARIO_BYTES = {
    "latin-1": (INCIDENT.replace("The 2026", "Die 2026 Störung").encode("latin-1"),
                "not UTF-8 text: byte 0xf6"),
    "utf-16": (INCIDENT.encode("utf-16"), "not UTF-8 text (UTF-16?)"),
    "random bytes": (bytes(range(128, 256)) * 4, "not UTF-8 text"),
    "600 brackets": ((INCIDENT + "\n[extra]\nx = " + "[" * 600 + "]" * 600 + "\n").encode(),
                     "nested more than 64 deep"),
    "5,000 digits": (INCIDENT.replace("pool_pages = 2", "pool_pages = " + "9" * 5000, 1).encode(),
                     "a number of more than 40 digits"),
    "100,000-character key": ((INCIDENT + "\n" + "k" * 100_000 + " = 1\n").encode(),
                              "unknown key 'events.kkkk"),
    "empty": (b"", "name is required"),
}


@pytest.mark.parametrize("kind", sorted(SCENARIO_BYTES))
def test_malformed_scenario_file_is_one_line(tmp_path, kind):
    data, fragment = SCENARIO_BYTES[kind]
    (tmp_path / "s.toml").write_bytes(data)
    r = run("check", "--release", "0.5.19", "--scenario-file", "s.toml", "--out", "out",
            cwd=tmp_path)
    one_line(r, fragment)
    assert not (tmp_path / "out").exists()


TRACE_TEXT = TRACE.read_text()
TRACE_BYTES = {
    "latin-1": (TRACE_TEXT.replace('"reqmodel"', '"reqmödel"').encode("latin-1"),
                "not UTF-8 text"),
    "utf-16": (TRACE_TEXT.encode("utf-16"), "not UTF-8 text (UTF-16?)"),
    "600 brackets": (b'{"x": ' + b"[" * 600 + b"]" * 600 + b"}", "nested more than 64 deep"),
    "5,000 digits": (b'{"vars": [], "states": [' + b"9" * 5000 + b"]}",
                     "a number of more than 40 digits"),
    "a directory": (None, "is a directory"),
}


@pytest.mark.parametrize("kind", sorted(TRACE_BYTES))
@pytest.mark.parametrize("command", ["replay", "show"])
def test_malformed_trace_file_is_one_line(tmp_path, kind, command):
    data, fragment = TRACE_BYTES[kind]
    if data is None:
        (tmp_path / "t.json").mkdir()
    else:
        (tmp_path / "t.json").write_bytes(data)
    one_line(run(command, "t.json", cwd=tmp_path), fragment)


@pytest.mark.parametrize("name", ["../../escape", "/abs/path", "a\u0000b", "x" * 300,
                                  "..", "sub/dir", "[/]", "x[/dim]y", "[bold]b[/bold]"])
def test_scenario_names_stay_inside_out_and_do_not_break_the_table(tmp_path, name):
    toml = INCIDENT.replace('name = "incident"', f"name = {json.dumps(name)}")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "s.toml").write_text(toml)
    r = run("check", "--release", "0.5.19", "--scenario-file", "s.toml", "--out", "out",
            "--property", "no-foreign-kv-read", cwd=tmp_path / "work")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    written = files_under(tmp_path)
    assert [p.name for p in written if p.suffix == ".json"], "the trace was written"
    out = (tmp_path / "work" / "out").resolve()
    for p in written:
        if p.suffix == ".json":
            assert out in p.resolve().parents, p
            assert len(p.name) < 200
    # the table shows the name as it is, not as markup
    if "[" in name:
        assert name in r.stdout


def test_out_under_a_regular_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    one_line(run("check", "--release", "0.5.19", "--out", "afile/sub", cwd=tmp_path),
             "afile is a file, not a directory")


def test_a_refused_scenario_leaves_no_trace_of_the_earlier_ones(tmp_path):
    """check over several scenarios: the second is refused by --max-states
    after the first found violations; nothing is written."""
    r = run("check", "--release", "0.5.19", "--scenario", "incident", "--scenario",
            "room-reuse", "--max-states", "2000", "--out", "out", "--json", cwd=tmp_path)
    one_line(r, "more than 2,000 distinct states on scenario 'room-reuse'")
    assert not (tmp_path / "out").exists() or not files_under(tmp_path / "out")


def _trace_with(edit):
    data = json.loads(TRACE_TEXT)
    edit(data)
    return json.dumps(data)


ITF_VALUES = {
    "hex bigint": (lambda d: d["states"][1]["#meta"]["params"].__setitem__(
        "rid", {"#bigint": "0x1"}), 'at states[1].#meta.params.rid.#bigint: "0x1" is not'),
    "empty rid": (lambda d: d["states"][1]["#meta"]["params"].__setitem__("rid", ""),
                  'at states[1].#meta.params.rid: "" is not a valid value'),
    "null rid": (lambda d: d["states"][1]["#meta"]["params"].__setitem__("rid", None),
                 "at states[1].#meta.params.rid: null is not a valid value"),
    "release list": (lambda d: d["#meta"].__setitem__("release", ["0.5.19"]),
                     'at #meta.release: expected string, got ["0.5.19"]'),
    "property list": (lambda d: d["#meta"].__setitem__("property", ["x"]),
                      "at #meta.property: expected string"),
    "guards list": (lambda d: d["#meta"].__setitem__("guards", ["g.py"]),
                    "at #meta.guards: expected string"),
    "action list": (lambda d: d["states"][2]["#meta"].__setitem__("action", ["p_door"]),
                    "at states[2].#meta.action: expected string"),
    "scenario_config null": (lambda d: d["#meta"].__setitem__("scenario_config", None),
                             "at #meta.scenario_config: expected object, got null"),
    "scenario_config number": (lambda d: d["#meta"].__setitem__("scenario_config", 3),
                               "at #meta.scenario_config: expected object, got 3"),
}


@pytest.mark.parametrize("kind", sorted(ITF_VALUES))
def test_itf_values_of_the_wrong_type_are_one_line(tmp_path, kind):
    edit, fragment = ITF_VALUES[kind]
    (tmp_path / "t.json").write_text(_trace_with(edit))
    one_line(run("replay", "t.json", cwd=tmp_path), fragment)
