"""Bad input at the edge (issue #26, first part): files read as bytes and
decoded explicitly, size, depth and number limits before any parser, names
that cannot leave --out or break the terminal, messages of one short line,
and no file left by a command that is refused part-way."""
import json
import os
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


def last_line(r, fragment):
    """A failure after the work ran: the progress lines, then one line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert fragment in r.stderr.splitlines()[-1], r.stderr


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


PROPOSALS = {
    "not a .py suffix": ("prop.txt", "base = '0.5.20'\ndef prefill_door(req):\n"
                         "    return bool(req.is_retracted)\n", None),
    "base a list": ("p.py", "base = ['0.5.20']\ndef prefill_door(req):\n    return False\n",
                    "base must be a release name such as \"0.5.20\", not ['0.5.20'] (list)"),
    "override key not a string": ("p.py", "base = '0.5.20'\nscenario_overrides = {1: {}}\n",
                                  "scenario_overrides: a table name must be a string"),
    "override values not a dict": ("p.py", "base = '0.5.20'\n"
                                   "scenario_overrides = {'prefill': [1]}\n",
                                   "scenario_overrides['prefill'] must be a dict"),
    "garbage shared object": ("p.so", bytes(range(256)) * 8, "not UTF-8 text: byte 0x80"),
    "sys.exit(3) at import": ("p.py", "import sys\nbase = '0.5.20'\nsys.exit(3)\n",
                              "does not import: SystemExit(3)"),
    "SystemExit(0) in a guard": ("p.py", "base = '0.5.20'\ndef prefill_door(req):\n"
                                 "    raise SystemExit(0)\n", "prefill_door raised SystemExit(0)"),
    "loop at import": ("p.py", "base = '0.5.20'\nwhile True:\n    pass\n",
                       "importing it did not finish within 2 s"),
    "loop in a guard": ("p.py", "base = '0.5.20'\ndef prefill_door(req):\n    while True:\n"
                        "        pass\n", "prefill_door did not finish within 1 s"),
    "loop that swallows Exception": ("p.py", "base = '0.5.20'\ndef prefill_door(req):\n"
                                     "    while True:\n        try:\n            pass\n"
                                     "        except Exception:\n            pass\n",
                                     "did not finish within 1 s"),
    "loop the symbolic pass cannot reach": (
        "p.py", "base = '0.5.20'\ndef prefill_door(req):\n"
        "    if [0, 1, 1, 1, 1][req.origin_pages]:\n        while True:\n            pass\n"
        "    return False\n", "prefill_door did not finish within 1 s"),
    "non-bool on one branch": ("p.py", "base = '0.5.20'\ndef prefill_door(req):\n"
                               "    if req.is_retracted:\n        return 'x'\n    return False\n",
                               "prefill_door returns 'x' (str) on some request; it must return "
                               "bool (when req.is_retracted == 1)"),
    "multi-line exception": ("p.py", "base = '0.5.20'\nraise ValueError('one\\ntwo\\nthree')\n",
                             "does not import: ValueError: one"),
}


@pytest.mark.parametrize("kind", sorted(PROPOSALS))
def test_proposals_are_user_code_behind_a_boundary(tmp_path, kind):
    """Whatever a proposal does at import or in a guard, the command ends in
    one line and exit 2 within the time limit ($REQMODEL_USERCODE_SECONDS, 1
    here; twice that for the import), writing nothing; a wrong return type on
    any path is refused before the run."""
    name, text, fragment = PROPOSALS[kind]
    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    r = subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", "guard",
                        "check", name, "--scenario", "incident", "--no-cost", "--out", "out"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "REQMODEL_USERCODE_SECONDS": "1"})
    if fragment is None:  # a proposal is Python source whatever its suffix
        assert r.returncode == 0, r.stderr
        assert "replaces prefill_door" in r.stdout
        return
    one_line(r, fragment)
    assert str(name) in r.stderr
    assert r.stdout == "" and not (tmp_path / "out").exists()


def test_a_write_that_fails_leaves_nothing(tmp_path):
    """Every command writes all its files or none (reqmodel/output.py): here
    the first release's trace directory cannot be made (a file is in the
    way), and the second release's traces are not written either."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "0.5.19").write_text("")
    r = run("check", "--release", "0.5.19,0.5.20", "--out", "out", cwd=tmp_path)
    last_line(r, "cannot write out/0.5.19/")
    assert "Not a directory" in r.stderr and "were not written either" in r.stderr
    assert files_under(tmp_path / "out") == [tmp_path / "out" / "0.5.19"]


def test_audit_whose_report_cannot_be_written_leaves_no_trace(tmp_path):
    (tmp_path / "afile").write_text("")
    r = run("audit", "--release", "0.5.19",
            "--prefill-args", "--context-length 1048576 --max-total-tokens 681280",
            "--decode-args", "--context-length 1048576 --max-total-tokens 2040000",
            "--out", "out", "--markdown", "afile/report.md", cwd=tmp_path)
    last_line(r, "cannot write afile/report.md: Not a directory")
    assert not (tmp_path / "out").exists()


def test_guard_check_that_fails_on_a_later_scenario_leaves_no_trace(tmp_path):
    """The proposal breaks cells on the first scenario (traces due) and
    raises on the second: nothing is written."""
    (tmp_path / "p.py").write_text(
        "base = '0.5.20'\n_calls = [0]\n"
        "def prefill_door(req):\n"
        "    _calls[0] += 1\n"
        "    if _calls[0] > 100:\n"
        "        raise RuntimeError('late')\n"
        "    return bool(req.is_retracted)\n")
    r = run("guard", "check", "p.py", "--scenario", "retract-abort", "--scenario", "room-reuse",
            "--no-cost", "--out", "out", cwd=tmp_path)
    one_line(r, "p.py: prefill_door raised RuntimeError: late")
    assert not (tmp_path / "out").exists()
    r = run("guard", "check", "p.py", "--scenario", "retract-abort", "--no-cost", "--out", "out",
            cwd=tmp_path)
    assert r.returncode == 0 and files_under(tmp_path / "out"), "the first scenario alone writes"


def test_conform_trace_on_a_mutant_or_proposal_trace_says_what_it_is(tmp_path):
    """A mutant's or proposal's trace has no SGLang code of its own: one line
    saying so and how to replay its steps on a release (it said the
    conformance environment had no 'sglang door-without-cleanup')."""
    mutant = ROOT / "counterexamples/mutants/door-without-cleanup"
    mutant = sorted(mutant.glob("*.itf.json"))[0]
    one_line(run("conform", "--trace", str(mutant), "--dir", "no-env", cwd=tmp_path),
             "made on 'door-without-cleanup', a deliberate change of the model (a mutant)")
    (tmp_path / "t.json").write_text(_trace_with(
        lambda d: d["#meta"].update(guards="p.py", base="0.5.20")))
    one_line(run("conform", "--trace", "t.json", "--dir", "no-env", cwd=tmp_path),
             "made on the proposal p.py (base 0.5.20), which no SGLang release contains")


def test_out_names_with_markup_or_too_long_are_printed_or_refused_in_one_line(tmp_path):
    """Rich reads '[/]' as a closing tag: a path is printed as written. A name
    longer than the file system allows is refused before any work, wherever
    it is in the path."""
    r = run("check", "--out", "x[/]", "--property", "no-foreign-kv-read", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "written under x[/]/" in " ".join(r.stdout.split())
    assert files_under(tmp_path / "x[")
    for out in ("a" * 300, str(tmp_path / "ok" / ("a" * 300) / "b")):
        one_line(run("check", "--out", out, cwd=tmp_path), "longer than the file system allows")
    assert not (tmp_path / "ok").exists()


def test_a_proposal_path_with_markup_is_printed_as_written(tmp_path):
    (tmp_path / "[").mkdir()
    (tmp_path / "[" / "].py").write_text((ROOT / "notes/examples/deny-all.py").read_text())
    r = run("guard", "diff", "0.5.20", "[/].py", "--no-reach", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "guard diff 0.5.20 -> [/].py" in r.stdout


def test_small_traps_get_a_useful_line(tmp_path):
    """A scenario file passed as a proposal, another tool's ITF trace and a
    misspelt server flag each get one line that says what to do; a
    comma-separated --property is the same as repeating it."""
    scen = ROOT / "reqmodel/scenarios/incident.toml"
    one_line(run("replay", str(TRACE), "--guards", str(scen), cwd=tmp_path),
             "a TOML file, not a proposal")
    (tmp_path / "inc.py").write_text(scen.read_text())  # TOML under a .py name
    one_line(run("guard", "check", "inc.py", "--no-cost", cwd=tmp_path),
             "a TOML file, not a proposal")
    (tmp_path / "other.itf.json").write_text('{"vars": ["x"], "states": [{"x": 1}, {"x": 2}]}')
    one_line(run("show", "other.itf.json", cwd=tmp_path), "not a reqmodel trace")
    one_line(run("audit", "--release", "0.5.22", "--prefill-args", "--context-lenght 100",
                 "--decode-args", "--context-length 100", cwd=tmp_path),
             "did you mean '--context-length'")
    r = run("check", "--property", "no-foreign-kv-read,abort-is-terminal", "--json",
            "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {x["property"] for x in json.loads(r.stdout)["results"]} == {
        "no-foreign-kv-read", "abort-is-terminal"}
    one_line(run("check", "--property", "no-foreign-kv-read,", cwd=tmp_path),
             "unknown property ''")
