"""A fuzz test of the tool's own edge (issue #26): Hypothesis mutates the
built-in scenarios, corpus traces, example proposals and valid argument
lists of every command into inputs that are malformed by construction, runs
the command in this process, and asserts on every draw: exit status 2, one
short line on stderr starting ``reqmodel:``, no traceback (an exception
escaping ``main`` fails the draw), and no file written, neither under the
command's ``--out`` nor anywhere else in its working directory.

Each mutation is chosen so that the input cannot be valid (a value of a type
no key accepts, an unknown name, a cut text, a guard point that does not
exist, ...): a draw that exits 0 or 1 is a check the edge is missing.

Examples per kind: ``$REQMODEL_FUZZ_EXAMPLES`` (default 100: about 6 s for
the five kinds together on one core, so CI's cost stays well under a
minute); the draws are derandomized, so CI sees the same inputs each run,
and ``REQMODEL_FUZZ_EXAMPLES=400`` is the long run (notes/bad-input.md
records its figures), with ``REQMODEL_FUZZ_RANDOM=1`` for new draws.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import re
import tempfile
import tomllib

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reqmodel.cli import main
from reqmodel.model import scenario as sc_mod
from reqmodel.model.actions import BY_NAME
from reqmodel.model.guards import GUARD_POINTS

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("REQMODEL_FUZZ_EXAMPLES", "100"))
# REQMODEL_FUZZ_RANDOM=1: new draws each run (for a long hunt; CI is derandomized)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=not os.environ.get("REQMODEL_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

SCENARIOS = {p.name: p.read_text() for p in sorted((ROOT / "reqmodel/scenarios").glob("*.toml"))}
SCENARIOS.update({p.name: p.read_text() for p in sorted((ROOT / "notes/examples").glob("*.toml"))})
TRACES = {str(p.relative_to(ROOT)): p.read_text()
          for p in sorted((ROOT / "counterexamples").rglob("*.itf.json"))
          if p.stat().st_size < 40_000}
PROPOSALS = {p.name: p.read_text() for p in sorted((ROOT / "notes/examples").glob("*.py"))}
INCIDENT_TRACE = ROOT / "counterexamples/0.5.19/no-foreign-kv-read-incident.itf.json"
NAMES = st.from_regex(r"[a-z][a-z0-9_]{2,12}", fullmatch=True)


def invoke(argv, cwd: pathlib.Path, files: dict):
    """Write ``files`` into ``cwd``, run ``reqmodel ARGV`` there in this
    process; (exit status, stdout, stderr, files the command left)."""
    for name, data in files.items():
        (cwd / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    before = {p for p in cwd.rglob("*")}
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(argv))
                code = 0
            except SystemExit as exc:
                code = exc.code
    finally:
        os.chdir(old)
    left = sorted(str(p.relative_to(cwd)) for p in set(cwd.rglob("*")) - before)
    return code, out.getvalue(), err.getvalue(), left


def assert_refused(argv, files: dict, why: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        code, out, err, left = invoke(argv, pathlib.Path(tmp), files)
    context = f"{why}: reqmodel {' '.join(map(str, argv))[:200]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"{context}: exit {code}, stderr {err[-500:]!r}"
    assert len(lines) == 1 and lines[0].startswith("reqmodel: "), f"{context}: {lines[:5]}"
    assert len(lines[0]) <= 300, f"{context}: {len(lines[0])} characters"
    assert "Traceback" not in err and "Traceback" not in out, context
    assert left == [], f"{context}: left {left[:5]}"


@pytest.fixture(autouse=True, scope="module")
def _fast_user_code():
    """Proposals that loop are stopped after 1 s (2 s at import)."""
    old = os.environ.get("REQMODEL_USERCODE_SECONDS")
    os.environ["REQMODEL_USERCODE_SECONDS"] = "1"
    repo_before = sorted(p.name for p in ROOT.iterdir())
    yield
    if old is None:
        del os.environ["REQMODEL_USERCODE_SECONDS"]
    else:
        os.environ["REQMODEL_USERCODE_SECONDS"] = old
    assert sorted(p.name for p in ROOT.iterdir()) == repo_before, "a draw wrote into the repo"


# ----------------------------------------------------------------- values

# a value of a type no scalar or list key of a scenario accepts
NOT_A_SCALAR = st.one_of(
    st.dictionaries(NAMES, st.integers(0, 3), min_size=1, max_size=2),
    st.lists(st.dictionaries(NAMES, st.booleans(), min_size=1, max_size=1), min_size=1,
             max_size=2),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)),
)
# a value where a table belongs
NOT_A_TABLE = st.one_of(st.integers(), st.booleans(), st.text(max_size=8),
                        st.lists(st.integers(), max_size=3))
# a value that is not an ITF step parameter (or a meta string)
NOT_A_PARAM = st.one_of(
    st.none(), st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)),
    st.dictionaries(NAMES, st.integers(), min_size=1, max_size=2),
    st.builds(lambda s: {"#bigint": s}, st.from_regex(r"0x[0-9a-f]{1,4}|[a-z]{1,4}|",
                                                      fullmatch=True)),
)
NOT_A_STRING = st.one_of(st.none(), st.integers(), st.booleans(), st.lists(st.text(max_size=4),
                                                                          min_size=1, max_size=2),
                         st.dictionaries(NAMES, st.integers(), max_size=1),
                         st.text(min_size=201, max_size=260))


def _paths(data, prefix=()):
    """Every key path of a parsed TOML document, with its value."""
    for key, value in data.items():
        yield prefix + (key,), value
        if isinstance(value, dict):
            yield from _paths(value, prefix + (key,))


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _delete(data, path):
    for key in path[:-1]:
        data = data[key]
    del data[path[-1]]


# --------------------------------------------------------------- scenarios

@st.composite
def bad_scenarios(draw):
    """(file bytes, what was done) for a built-in scenario made malformed."""
    name = draw(st.sampled_from(sorted(SCENARIOS)))
    text = SCENARIOS[name]
    data = tomllib.loads(text)
    kind = draw(st.sampled_from(["wrong type", "scalar for a table", "unknown key",
                                 "missing required key", "not UTF-8", "TOML syntax",
                                 "cut short", "duplicate table", "out of range"]))
    paths = list(_paths(data))
    if kind == "wrong type":
        path, _ = draw(st.sampled_from([(p, v) for p, v in paths if not isinstance(v, dict)]))
        _set(data, path, draw(NOT_A_SCALAR))
    elif kind == "scalar for a table":
        path = draw(st.sampled_from([p for p, v in paths if isinstance(v, dict)]))
        _set(data, path, draw(NOT_A_TABLE))
    elif kind == "unknown key":
        tables = [()] + [p for p, v in paths if isinstance(v, dict)]
        where = draw(st.sampled_from(tables))
        key = draw(NAMES.filter(lambda k: k not in sc_mod._TOP | sc_mod._PREFILL
                                | sc_mod._DECODE | sc_mod._OPTIONS | sc_mod._EVENTS))
        _set(data, where + (key,), draw(st.integers(0, 3)))
    elif kind == "missing required key":
        _delete(data, (draw(st.sampled_from(["name", "prompt_pages", "prefill", "decode"])),))
    elif kind == "out of range":
        pages = list(data["prompt_pages"])
        pages[draw(st.integers(0, len(pages) - 1))] = draw(st.sampled_from([0, -1, 10_000]))
        data["prompt_pages"] = pages
    if kind in ("wrong type", "scalar for a table", "unknown key", "missing required key",
                "out of range"):
        return tomli_w.dumps(data).encode(), f"{kind} in {name}"
    raw = text.encode()
    at = draw(st.integers(0, len(raw) - 1))
    if kind == "not UTF-8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xe2\x82", b"\x80", b"\xfe\xfe"]))
        return raw[:at] + bad + raw[at:], f"{kind} at {at} in {name}"
    if kind == "TOML syntax":
        line = draw(st.sampled_from(["[[[", "x = ", "= 1", "a = [1,", 'b = "open',
                                     "[prefill", "c = 1 2", "d = {e = }"]))
        lines = text.splitlines()  # before a table header: never inside a string
        k = draw(st.sampled_from([i for i, x in enumerate(lines) if x.startswith("[")]
                                 + [len(lines)]))
        return "\n".join(lines[:k] + [line] + lines[k:]).encode(), f"{kind} {line!r} in {name}"
    if kind == "cut short":  # inside the first table header: never valid TOML
        cut = text.index("[prefill]") + draw(st.integers(1, len("[prefill]") - 1))
        return raw[:cut], f"{kind} at {cut} in {name}"
    # duplicate table
    return (text + "\n[decode]\npool_pages = 1\n").encode(), f"{kind} in {name}"


@FUZZ
@given(bad_scenarios(), st.sampled_from(["check", "guard check"]))
def test_fuzz_scenario_files(case, command):
    data, why = case
    if command == "check":
        argv = ["check", "--release", "0.5.19", "--scenario-file", "s.toml", "--out", "out"]
    else:
        argv = ["guard", "check", "p.py", "--scenario-file", "s.toml", "--no-cost",
                "--out", "out"]
    assert_refused(argv, {"s.toml": data, "p.py": PROPOSALS["naive-door-on-0.5.20.py"]}, why)


# ----------------------------------------------------------------- traces

META_STRINGS = ("format", "source", "release", "scenario", "property", "kind", "violation",
                "engine", "guards", "base")


@st.composite
def bad_traces(draw):
    name = draw(st.sampled_from(sorted(TRACES)))
    text = TRACES[name]
    data = json.loads(text)
    steps = range(1, len(data["states"]))
    kind = draw(st.sampled_from(["meta not a string", "scenario_config not a table",
                                 "action not a string", "unknown action", "bad parameter",
                                 "missing required key", "unknown release", "unknown property",
                                 "not JSON", "not UTF-8", "bad count"]))
    if kind == "meta not a string":
        data["#meta"][draw(st.sampled_from(META_STRINGS))] = draw(NOT_A_STRING)
    elif kind == "scenario_config not a table":
        data["#meta"]["scenario_config"] = draw(NOT_A_TABLE | st.none())
    elif kind == "action not a string":
        data["states"][draw(st.sampled_from(steps))]["#meta"]["action"] = draw(NOT_A_STRING)
    elif kind == "unknown action":
        data["states"][draw(st.sampled_from(steps))]["#meta"]["action"] = draw(
            NAMES.filter(lambda a: a not in BY_NAME))
    elif kind == "bad parameter":
        with_params = [k for k in steps if data["states"][k]["#meta"].get("params")]
        k = draw(st.sampled_from(with_params))
        key = draw(st.sampled_from(sorted(data["states"][k]["#meta"]["params"])))
        data["states"][k]["#meta"]["params"][key] = draw(NOT_A_PARAM)
    elif kind == "missing required key":
        what = draw(st.sampled_from(["vars", "states", "action"]))
        if what == "action":
            del data["states"][draw(st.sampled_from(steps))]["#meta"]["action"]
        else:
            del data[what]
    elif kind == "unknown release":
        data["#meta"]["release"] = draw(st.from_regex(r"0\.[0-9]\.[3-9][0-9]|9\.9|x[a-z]{1,5}",
                                                      fullmatch=True))
    elif kind == "unknown property":
        data["#meta"]["property"] = draw(NAMES.map(lambda s: "no-such-" + s))
    elif kind == "bad count":
        data["#meta"][draw(st.sampled_from(["request", "depth", "loop"]))] = draw(
            st.sampled_from([-1, "1", 1.5, [1]]))
    if kind not in ("not JSON", "not UTF-8"):
        return json.dumps(data).encode(), f"{kind} in {name}"
    raw = text.encode()
    if kind == "not JSON":
        cut = draw(st.integers(1, len(raw.rstrip()) - 1))
        return raw[:cut], f"cut at {cut} in {name}"
    at = draw(st.integers(0, len(raw) - 1))
    return raw[:at] + b"\xff" + raw[at:], f"byte 0xff at {at} in {name}"


@FUZZ
@given(bad_traces(), st.sampled_from(["replay", "replay --json", "show", "show --format report"]))
def test_fuzz_trace_files(case, command):
    data, why = case
    assert_refused(command.split()[:1] + ["t.itf.json"] + command.split()[1:],
                   {"t.itf.json": data}, why)


# -------------------------------------------------------------- proposals

def _guards(text: str):
    return [m for m in re.finditer(r"^def (\w+)\((.*)\):\n((?:    .*\n|\n)+)", text, re.M)
            if m.group(1) in GUARD_POINTS]


@st.composite
def bad_proposals(draw):
    name = draw(st.sampled_from(sorted(PROPOSALS)))
    text = PROPOSALS[name]
    guards = _guards(text)
    kinds = ["base", "unknown guard point", "line inserted at top level", "field type",
             "not UTF-8 or NUL", "raises at import"]
    if guards:
        kinds += ["wrong return", "signature"]
    kind = draw(st.sampled_from(kinds))
    if kind == "base":
        value = draw(st.sampled_from(['"0.4.0"', '"0.5.99"', "['0.5.20']", "20", "None",
                                     '{"r": "0.5.20"}', '""']))
        text = re.sub(r"^base = .*$", f"base = {value}", text, flags=re.M)
    elif kind == "unknown guard point":
        text += f"\n\ndef {draw(NAMES.filter(lambda n: n not in GUARD_POINTS))}(req):\n" \
                "    return False\n"
    elif kind == "line inserted at top level":  # a syntax error, or it raises
        lines = text.splitlines()  # before a top-level statement: not inside a string
        k = draw(st.sampled_from([i for i, x in enumerate(lines)
                                  if x.startswith(("def ", "from ", "import ", "base"))]
                                 + [len(lines)]))
        stmt = draw(st.sampled_from(["1 / 0", "undefined_name_xyz", "raise SystemExit(3)",
                                     "import no_such_module_xyz", "def (", "return 1",
                                     "raise ValueError('a\\nb')", "assert False, 'no'"]))
        text = "\n".join(lines[:k] + [stmt] + lines[k:]) + "\n"
    elif kind == "field type":
        field, value = draw(st.sampled_from([
            ("retire_cleanup", '"full"'), ("retire_cleanup", "[1, 2]"),
            ("retire_cleanup", '("session", "pray")'), ("checksum", '"sha256"'),
            ("checksum", "3"), ("scenario_overrides", "[1]"),
            ("scenario_overrides", '{"prefill": 3}'), ("scenario_overrides", '{"nope": {}}'),
            ("scenario_overrides", '{1: {}}'), ("scenario_overrides", '{"prefill": {2: 1}}'),
            ("scenario_overrides", '{"decode": {"pool_pages": "many"}}'),
            ("description", "3"), ("description", "['a']")]))
        text += f"\n{field} = {value}\n"
    elif kind == "not UTF-8 or NUL":
        raw = text.encode()
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\x00", b"\xc3\x28"])) + raw[at:], \
            f"{kind} at {at} in {name}"
    elif kind == "raises at import":
        exc = draw(st.sampled_from(["SystemExit(0)", "SystemExit('bye')", "GeneratorExit()",
                                    "MemoryError()", "RecursionError('deep')",
                                    "OSError(5, 'io')", "Exception('x' * 5000)"]))
        text += f"\nraise {exc}\n"
    elif kind == "wrong return":
        m = draw(st.sampled_from(guards))
        value = draw(st.sampled_from(["'yes'", "2.5", "[]", "{}", "object()", "'requeue!'",
                                      "req", "print"]))
        body = f"    if {draw(st.sampled_from(['True', 'not False']))}:\n" \
               f"        return {value}\n" + m.group(3)
        text = text[:m.start(3)] + body + text[m.end(3):]
    elif kind == "signature":
        m = draw(st.sampled_from(guards))
        args = draw(st.sampled_from([m.group(2) + ", extra", "", "*args",
                                     m.group(2) + ", *, k=1", "**kw"]))
        text = text[:m.start(2)] + args + text[m.end(2):]
    return text.encode(), f"{kind} in {name}"


@FUZZ
@given(bad_proposals(), st.sampled_from(["guard check", "guard diff", "replay --guards"]))
def test_fuzz_proposals(case, command):
    data, why = case
    if command == "guard check":
        argv = ["guard", "check", "p.py", "--scenario", "incident", "--no-cost", "--out", "out"]
    elif command == "guard diff":
        argv = ["guard", "diff", "0.5.20", "p.py", "--no-reach"]
    else:
        argv = ["replay", str(INCIDENT_TRACE), "--guards", "p.py"]
    assert_refused(argv, {"p.py": data}, why)


# --------------------------------------------------------- startup logs

SCHED = ("[2026-03-02 10:00:01] max_total_num_tokens={tokens}, chunked_prefill_size=8192, "
         "max_prefill_tokens=16384, max_running_requests=256, context_len={context}, "
         "available_gpu_mem=10.50 GB\n")
NUMBER = st.one_of(st.integers(0, 3).map(str), st.integers(19, 6000).map(lambda n: "9" * n))


@st.composite
def bad_logs(draw):
    """A prefill startup log that cannot be used: no startup line, two
    different contexts, numbers too long or too small, or not text."""
    noise = draw(st.lists(st.text(max_size=40).filter(lambda t: "max_total" not in t),
                          max_size=5))
    kind = draw(st.sampled_from(["no startup line", "two contexts", "bad numbers",
                                 "garbled line"]))
    if kind == "no startup line":
        lines = noise
    elif kind == "two contexts":
        a, b = draw(st.lists(st.integers(1000, 10**6), min_size=2, max_size=2, unique=True))
        lines = noise + [SCHED.format(tokens=681280, context=a),
                         SCHED.format(tokens=681280, context=b)]
    elif kind == "bad numbers":
        lines = noise + [SCHED.format(tokens=draw(NUMBER), context=draw(NUMBER))]
    else:
        line = SCHED.format(tokens=681280, context=1048576)
        cut = draw(st.integers(1, line.index("context_len") + 5))
        lines = noise + [line[:cut] + draw(st.sampled_from(["", "\x00", "=", ", ,"]))]
    return "\n".join(lines).encode(), kind


@FUZZ
@given(bad_logs())
def test_fuzz_startup_logs(case):
    data, why = case
    assert_refused(["audit", "--release", "0.5.22", "--prefill-args", "--context-length 1048576",
                    "--decode-args", "--context-length 1048576 --max-total-tokens 2040000",
                    "--prefill-log", "p.log", "--out", "out"], {"p.log": data}, why)


# -------------------------------------------------------------- arguments

VALID = {
    "check": ["check", "--release", "0.5.19", "--scenario", "incident", "--out", "out"],
    "audit": ["audit", "--release", "0.5.22", "--prefill-args",
              "--context-length 1048576 --max-total-tokens 681280", "--decode-args",
              "--context-length 1048576 --max-total-tokens 2040000", "--out", "out"],
    "replay": ["replay", str(INCIDENT_TRACE), "--release", "0.5.20"],
    "show": ["show", str(INCIDENT_TRACE), "--format", "markdown"],
    "guard points": ["guard", "points"],
    "guard check": ["guard", "check", str(ROOT / "notes/examples/deny-all.py"), "--scenario",
                    "incident", "--out", "out"],
    "guard diff": ["guard", "diff", "0.5.19", "0.5.20", "--no-reach"],
    "scenarios": ["scenarios"],
    "properties": ["properties"],
    "releases": ["releases"],
    "conform": ["conform", "--release", "0.5.19", "--dir", "no-env-here"],
}
# (option, bad values) per command: values no option of that name accepts
BAD_VALUES = {
    "--release": ["0.4.0", "9.9.9", "0.5.19,", "all,0.5.19x", ""],
    "--scenario": ["no-such-scenario", "", "../incident"],
    "--property": ["no-such-property", ""],
    "--engine": ["nope", "Exhaustive"],
    "--depth": ["x", "-3", "0", "1e3"],
    "--max-states": ["0", "-1", "many", "1.5"],
    "--workers": ["0", "two"],
    "--format": ["bogus", "html"],
    "--point": ["front_door"],
    "--cases": ["0", "x"],
    "--assume": ["telepathy"],
    "--env": ["NOT_AN_SGLANG_VAR=1", "=1", "prefill:", "router:SGLANG_X=1"],
    "--prefill-args": ["--no-such-flag 1", "--context-length many", "--tp-size",
                       "--context-length " + "9" * 5000, "--page-size -1e999"],
    "--decode-args": ["--no-such-flag", "--max-total-tokens -"],
    "--prefill-log": ["no-such.log"],
    "--scenario-file": ["no-such.toml"],
    "--guards": ["no-such.py"],
    # a name longer than the file system allows, anywhere in the path
    "--out": ["a" * 300, "ok/" + "b" * 300 + "/c"],
}
OPTIONS_OF = {
    "check": ["--release", "--scenario", "--property", "--engine", "--max-states", "--workers",
              "--scenario-file", "--out"],
    "audit": ["--release", "--assume", "--env", "--prefill-args", "--decode-args",
              "--prefill-log", "--workers", "--out"],
    "replay": ["--release", "--guards"],
    "show": ["--format", "--guards"],
    "guard check": ["--scenario", "--engine", "--max-states", "--scenario-file", "--out"],
    "guard diff": ["--scenario", "--point", "--max-states"],
    "conform": ["--release", "--cases"],
}


@st.composite
def bad_arguments(draw):
    command = draw(st.sampled_from(sorted(VALID)))
    argv = list(VALID[command])
    kinds = ["unknown option", "extra argument"]
    if command in OPTIONS_OF:
        kinds += ["bad value", "value missing"]
    if command in ("replay", "show", "guard check"):
        kinds.append("missing file")
    kind = draw(st.sampled_from(kinds))
    if kind == "unknown option":
        argv.insert(draw(st.integers(1 + (command.startswith("guard")), len(argv))),
                    "--" + draw(NAMES.filter(lambda n: n not in ("help", "version"))))
    elif kind == "extra argument":
        if command in ("audit", "check", "conform"):
            argv.append(draw(NAMES))
        else:
            argv += ["a1", "a2", "a3"]
    elif kind == "bad value":
        option = draw(st.sampled_from(OPTIONS_OF[command]))
        argv += [option, draw(st.sampled_from(BAD_VALUES[option]))]
    elif kind == "value missing":
        argv.append(draw(st.sampled_from(OPTIONS_OF[command])))
    else:
        k = next(i for i, a in enumerate(argv) if a.endswith((".json", ".py")))
        argv[k] = draw(NAMES) + argv[k][-5:]
    return argv, f"{kind} for {command}"


@FUZZ
@given(bad_arguments())
def test_fuzz_arguments(case):
    argv, why = case
    assert_refused(argv, {}, why)
