"""`reqmodel replay` and `reqmodel show`, and their refusals of bad files."""
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
INCIDENT = ROOT / "counterexamples/0.5.19/no-foreign-kv-read-incident.itf.json"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def test_replay_on_its_release_reproduces_the_violation():
    r = run("replay", str(INCIDENT), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"property": "no-foreign-kv-read", "release": "0.5.19",
                                    "steps_replayed": 29, "first_disabled_step": None,
                                    "violated": True, "timing": []}


def test_replay_on_a_fixed_release_reports_the_first_disabled_step():
    r = run("replay", str(INCIDENT), "--release", "0.5.21", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0
    assert out["violated"] is False
    assert out["first_disabled_step"] == out["steps_replayed"] + 1
    r = run("replay", str(INCIDENT), "--release", "0.5.21")
    assert "is not enabled" in r.stdout and "not violated" in r.stdout


@pytest.mark.parametrize("fmt,markers", [
    ("table", ["no-foreign-kv-read", "d_attend(r0)", "FOREIGN"]),
    ("markdown", ["| # | actor | action |", "**⚠ violation**", "page 0 last written by r1"]),
    ("mermaid", ["sequenceDiagram", "participant C as Client", "participant X as Transfer",
                 "rect rgb(255, 215, 215)", "⚠ violates no-foreign-kv-read"]),
    ("dot", ["digraph", "s24 -> s25", 'fillcolor="#ffd7d7"']),
])
def test_show_formats(fmt, markers):
    r = run("show", str(INCIDENT), "--format", fmt)
    assert r.returncode == 0, r.stderr
    for m in markers:
        assert m in r.stdout, m


def test_mermaid_labels_have_no_statement_separators():
    r = run("show", str(INCIDENT), "--format", "mermaid")
    for line in r.stdout.splitlines()[1:]:
        assert ";" not in line and "#" not in line.split(":", 1)[-1]


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")
def test_dot_is_valid_graphviz(tmp_path):
    r = run("show", str(INCIDENT), "--format", "dot")
    chk = subprocess.run(["dot", "-Tsvg"], input=r.stdout, capture_output=True, text=True)
    assert chk.returncode == 0, chk.stderr


def _trace(tmp_path, mutate):
    data = json.loads(INCIDENT.read_text())
    mutate(data)
    p = tmp_path / "t.itf.json"
    p.write_text(json.dumps(data))
    return str(p)


BAD = {
    "invalid JSON": (lambda d: None, "invalid JSON"),
    "no states": (lambda d: d.pop("states"), "missing 'states'"),
    "no vars": (lambda d: d.pop("vars"), "missing 'vars'"),
    "unknown action": (lambda d: d["states"][3]["#meta"].update(action="teleport"), "unknown action 'teleport'"),
    "unknown parameter": (lambda d: d["states"][3]["#meta"]["params"].update(rank={"#bigint": "1"}),
                          "unknown parameter 'rank'"),
    "missing parameter": (lambda d: d["states"][9]["#meta"]["params"].pop("pages"), "missing parameter 'pages'"),
    "unknown release": (lambda d: d["#meta"].update(release="0.4.0"), "unknown release '0.4.0'"),
    "no release": (lambda d: d["#meta"].pop("release"), "names no release"),
    "unknown property": (lambda d: d["#meta"].update(property="nice"), "unknown property 'nice'"),
    "request out of range": (lambda d: d["states"][1]["#meta"]["params"].update(rid={"#bigint": "7"}),
                             "request 7 is not in the scenario"),
}


@pytest.mark.parametrize("cmd", ["replay", "show"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trace_files_exit_2_in_one_line(tmp_path, cmd, case):
    mutate, fragment = BAD[case]
    if case == "invalid JSON":
        path = tmp_path / "t.itf.json"
        path.write_text("{\"vars\": [")
        path = str(path)
    else:
        path = _trace(tmp_path, mutate)
    r = run(cmd, path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in r.stderr


def test_replay_rejects_an_unknown_release_option():
    r = run("replay", str(INCIDENT), "--release", "9.9.9")
    assert r.returncode == 2 and "unknown release '9.9.9'" in r.stderr


def test_the_trace_guide_shows_current_output():
    guide = (ROOT / "notes/traces.md").read_text()
    for fmt in ("markdown", "mermaid"):
        out = run("show", str(INCIDENT), "--format", fmt).stdout
        assert out in guide, f"notes/traces.md is stale for --format {fmt}"


CORPUS = sorted((ROOT / "counterexamples").glob("*/*.itf.json"))


def test_show_and_replay_work_on_the_whole_corpus():
    """In-process (one subprocess per file would take minutes)."""
    from click.testing import CliRunner
    from reqmodel.cli.commands import cli
    runner = CliRunner()
    for path in CORPUS:
        for fmt in ("table", "markdown", "mermaid", "dot"):
            r = runner.invoke(cli, ["show", str(path), "--format", fmt])
            assert r.exit_code == 0, (path, fmt, r.output)
        r = runner.invoke(cli, ["replay", str(path), "--json"])
        assert r.exit_code == 0 and json.loads(r.output)["violated"] is True, path


def test_replay_on_a_guard_proposal():
    """The 0.5.19 incident trace against #38704's commit check on 0.5.19: the
    commit is refused, so the attention step is never enabled."""
    r = run("replay", str(INCIDENT), "--guards", "notes/examples/pr38704-on-0.5.19.py", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["violated"] is False
    assert out["release"] == "0.5.19+pr38704-on-0.5.19"
    assert out["first_disabled_step"] == 29
    r = run("replay", str(INCIDENT), "--guards", "notes/examples/pr38704-on-0.5.19.py",
            "--release", "0.5.19")
    assert r.returncode == 2 and "not both" in r.stderr


def test_replay_says_why_a_step_is_not_enabled(tmp_path):
    """Where a trace departs from a release, the first step that cannot be
    taken comes with why: its guard and the request's stages, an event the
    scenario does not allow, or a choice that is not on offer."""
    trace = ROOT / "counterexamples/0.5.19/no-foreign-kv-read-incident.itf.json"
    r = subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", "replay",
                        str(trace), "--release", "0.5.21", "--json"], capture_output=True,
                       text=True, cwd=tmp_path)
    data = json.loads(r.stdout)
    assert data["first_disabled_step"] == 22
    assert data["why_not"] == ("its guard bootstrap_ready does not hold for request 0 "
                               "(prefill GONE, decode TRANSFER)")
    from reqmodel.model import scenario
    from reqmodel.model.actions import Ctx, Step
    from reqmodel.model.actions.core import why_not
    from reqmodel.model.releases import get
    from reqmodel.model.actions.core import initial_state
    sc = scenario.builtin("incident")
    ctx, s = Ctx(get("0.5.19"), sc), initial_state(sc)
    assert "[events] client_abort is off for request 0" in why_not(ctx, s, Step("p_abort", 0, ()))
    assert "request 5 is not in the scenario" in why_not(ctx, s, Step("p_door", 5, ()))
    assert "no action 'nope'" in why_not(ctx, s, Step("nope", 0, ()))
    from reqmodel.traces import itf
    first = itf.read(str(trace))[1][0]
    assert why_not(ctx, s, first) == ""  # the incident's first step is enabled at the start


def test_show_says_what_could_have_caught_a_violation(tmp_path):
    """The scenario's settings, the guard points' decisions along the trace
    (recorded by replaying it, not listed by hand), and for a transfer-read
    property whether the KV checksum could compare anything."""
    def show(path):
        r = subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()",
                            "show", str(path)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout
    out = show(ROOT / "counterexamples/0.5.19/no-foreign-kv-read-incident.itf.json")
    assert "scenario settings: pools 2/4 pages" in out
    assert "step 5 p_door(r0): prefill_door (admit_all) -> False" in out
    assert "(prefill_door: True: retire the request" in out
    assert "KV checksum: none in 0.5.19" in out
    out = show(ROOT / "counterexamples/0.5.21/no-foreign-kv-read-auto-truncate.itf.json")
    assert "prefill_door (unadmitted_reject) -> False" in out
    assert "KV checksum: off on prefill and decode" in out
    from reqmodel.model import scenario
    from reqmodel.model.releases import get
    from reqmodel.traces.explain import checksum_line
    import attrs
    sc = scenario.builtin("auto-truncate-checksum")
    assert "on both roles over matching layouts" in checksum_line(get("0.5.21"), sc)
    one = attrs.evolve(sc, prefill=attrs.evolve(sc.prefill, kv_checksum=False))
    assert "off on prefill" in checksum_line(get("0.5.21"), one)
    assert "layouts differ" in checksum_line(get("0.5.21"), attrs.evolve(sc, layouts_match=False))
