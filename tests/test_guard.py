"""`reqmodel guard`: proposals, the comparison, the waste figures, and the
refusal of bad proposals."""
import json
import pathlib
import subprocess
import sys

import pytest

from reqmodel.proposals import guard_check as guardcheck
from reqmodel.model import guards
from reqmodel.model import properties
from reqmodel.proposals import proposal
from reqmodel.model import scenario
from reqmodel.model.state import DecodeReq, MetaSlot, PrefillReq

ROOT = pathlib.Path(__file__).parent.parent
EX = ROOT / "notes" / "examples"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def check(name, scenarios):
    prop = proposal.load(str(EX / f"{name}.py"))
    pending = []
    rows = guardcheck.compare(prop, [scenario.builtin(s) for s in scenarios],
                              properties.select([]), pathlib.Path("unused"), pending=pending)
    return prop, {(r.scenario, r.property): r for r in rows}, pending


def test_views_name_real_fields():
    samples = {"prefill req": PrefillReq(), "decode req": DecodeReq(), "slot": MetaSlot()}
    for view, fields in guards.VIEWS.items():
        for f in fields:
            getattr(samples[view], f)  # raises if the documented field does not exist
    for (gp, arg), view in guards.VIEW_OF_ARG.items():
        assert arg in guards.GUARD_POINTS[gp].args and view in guards.VIEWS


def test_guard_points_listing_is_generated_from_the_code():
    r = run("guard", "points")
    assert r.returncode == 0
    for gp in guards.GUARD_POINTS.values():
        assert gp.name in r.stdout
    for fields in guards.VIEWS.values():
        for f in fields:
            assert f in r.stdout


def test_naive_door_breaks_reentry_with_a_minimal_counterexample():
    prop, rows, pending = check("naive-door-on-0.5.20", ["retract-abort", "pause-abort"])
    for sc, length in (("retract-abort", 17), ("pause-abort", 17)):
        row = rows[(sc, "reentry-not-retired")]
        assert row.change == "broken"
        assert row.trace_length == length
    trace = next(t for path, t, s, m in pending
                 if path.name == "reentry-not-retired-retract-abort.itf.json")
    assert trace.steps[-1].action == "d_door"


def test_pr38935_breaks_nothing_and_reduces_waste():
    prop, rows, _ = check("pr38935-on-0.5.20", ["incident", "decode-reject", "retract-abort",
                                                 "pause-abort", "late-result"])
    # the one thing #38935 breaks: decode's door retires a prompt prefill
    # accepted, and nothing tells prefill, which waits for decode's metadata
    # until its 300 s bootstrap timeout (what 0.5.21+ do on decode-reject)
    broken = [k for k, r in rows.items() if r.change == "broken"]
    assert broken == [("decode-reject", "answered-without-timeout")]
    assert rows[broken[0]].trace_length == 4
    assert rows[("incident", "reject-acquires-nothing")].change == "fixed"
    cost = guardcheck.cost(prop, [scenario.builtin("incident")])["incident"]
    assert cost["base"]["rejected_acquires"]["prefill"]  # sender, metadata, forward, ...
    assert cost["proposal"]["rejected_acquires"]["prefill"] == []
    # decode still reserves for a prefill reject and holds it for the 300 s timeout
    assert cost["proposal"]["peer_acquires"]["decode"] == ["kv", "prealloc", "receiver"]
    assert cost["proposal"]["peer_hold_seconds"] == 300
    assert cost["proposal"]["timeout_only"] == [0]


def test_deny_all_is_broken_by_reachability():
    _, rows, _ = check("deny-all", ["incident", "retract-abort"])
    assert rows[("incident", "valid-request-completes")].change == "broken"
    assert rows[("retract-abort", "reentry-can-resume")].change == "broken"


def test_pr38704_on_0519_and_0523():
    _, rows, _ = check("pr38704-on-0.5.19", ["incident", "auto-truncate"])
    assert rows[("incident", "no-foreign-kv-read")].change == "fixed"
    assert rows[("auto-truncate", "no-foreign-kv-read")].change == "fixed"
    # a length check does not stop prefill from reporting success for its reject
    assert rows[("incident", "rejected-never-succeeds")].change == "still-violated"
    _, rows, _ = check("pr38704-on-0.5.23", ["incident", "auto-truncate"])
    assert rows[("auto-truncate", "no-foreign-kv-read")].change == "fixed"
    assert not [k for k, r in rows.items() if r.change == "broken"]


def test_checksum_on_both_roles():
    prop, rows, _ = check("kv-checksum-both-roles", ["auto-truncate", "incident"])
    assert prop.scenario_overrides
    assert rows[("auto-truncate", "no-foreign-kv-read")].change == "fixed"
    assert not [k for k, r in rows.items() if r.change == "broken"]


def test_cli_json_schema(tmp_path):
    r = run("guard", "check", str(EX / "naive-door-on-0.5.20.py"), "--scenario", "retract-abort",
            "--json", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["base"] == "0.5.20" and "cost" in data
    for row in data["results"]:
        assert set(row) == {"scenario", "property", "base_verdict", "proposal_verdict",
                            "change", "trace_file"}
        assert row["change"] in ("fixed", "broken", "no-longer-applies", "still-violated",
                                 "still-holds", "not-applicable")
    broken = [x for x in data["results"] if x["change"] == "broken"]
    assert broken and all(pathlib.Path(x["trace_file"]).exists() for x in broken)
    # the trace names its proposal, so show and replay find it on their own
    for x in broken:
        r = run("replay", x["trace_file"], "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["violated"] is True, r.stderr
        r = run("show", x["trace_file"], "--format", "markdown")
        assert r.returncode == 0 and "⚠ violation" in r.stdout


BAD = {
    "syntax": ("base = '0.5.20'\ndef prefill_door(req)\n    return True\n", "does not import: SyntaxError"),
    "import": ("import no_such_module_xyz\nbase = '0.5.20'\n", "does not import: ModuleNotFoundError"),
    "no base": ("def prefill_door(req):\n    return False\n", "names no base release"),
    "unknown base": ("base = '0.4.0'\ndef prefill_door(req):\n    return False\n", "unknown release '0.4.0'"),
    "unknown guard point": ("base = '0.5.20'\ndef front_door(req):\n    return False\n",
                            "front_door is not a guard point"),
    "signature": ("base = '0.5.20'\ndef decode_door(req):\n    return False\n",
                  "decode_door(req) has the wrong signature"),
    "raises": ("base = '0.5.20'\ndef prefill_door(req):\n    return 1 / 0\n",
               "prefill_door raised ZeroDivisionError"),
    "wrong type": ("base = '0.5.20'\ndef prefill_door(req):\n    return 'yes'\n",
                   "prefill_door returns 'yes' (str) on some request; it must return bool"),
    "wrong type later": ("base = '0.5.20'\ndef commit_check(req, slot, expected_room):\n    return 0\n",
                         "commit_check returns 0 (int) on some request"),
    "cleanup": ("base = '0.5.20'\nretire_cleanup = ('session', 'pray')\n", "retire_cleanup must be"),
    "overrides": ("base = '0.5.21'\nscenario_overrides = {'prefill': {'kv_checksum': 'on'}}\n",
                  "scenario_overrides"),
    "nothing": ("base = '0.5.20'\n", "replaces no guard point"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_proposals_exit_2_in_one_line(tmp_path, case):
    text, fragment = BAD[case]
    f = tmp_path / "proposal.py"
    f.write_text(text)
    out = tmp_path / "out"
    r = run("guard", "check", str(f), "--scenario", "incident", "--out", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0] and str(f) in lines[0], lines
    assert "Traceback" not in r.stderr
    assert r.stdout == "" and not out.exists()  # nothing else ran


def test_missing_proposal_file(tmp_path):
    r = run("guard", "check", str(tmp_path / "nope.py"))
    assert r.returncode == 2 and "no such proposal file" in r.stderr


def test_a_proposal_checked_by_z3_gets_the_exhaustive_engines_changes():
    """guard check --engine z3: on the small reject scenarios (which Z3
    proves), #38935's door on 0.5.20 fixes the same cells as the exhaustive
    check says, and breaks the same one: the deadlock form of
    answered-without-timeout finds prefill waiting for its bootstrap timeout.
    The liveness cells Z3 cannot decide are not-checked, never fixed: Z3
    finding no deadlock on the proposal does not prove the property."""
    prop = proposal.load(str(EX / "pr38935-on-0.5.20.py"))
    scs = [scenario.builtin(s) for s in ("both-reject", "decode-reject")]
    from reqmodel.engines.base import ENGINES
    z3_rows = guardcheck.compare(prop, scs, properties.select([]), pathlib.Path("unused"),
                                 ENGINES["z3"](depth=12))
    _, ex_rows, _ = check("pr38935-on-0.5.20", ["both-reject", "decode-reject"])
    graph = {p.name for p in properties.CATALOG.values() if p.kind.on_graph}
    z3_changes = {(r.scenario, r.property): r.change for r in z3_rows}
    ex_changes = {k: r.change for k, r in ex_rows.items()}
    undecided = {k for k, c in z3_changes.items() if c == "not-checked"}
    assert undecided and all(k[1] in graph for k in undecided)
    assert {k: c for k, c in z3_changes.items() if k not in undecided} == {
        k: c for k, c in ex_changes.items() if k not in undecided}
    assert z3_changes[("both-reject", "answered-without-timeout")] == "not-checked"
    assert ex_changes[("both-reject", "answered-without-timeout")] == "fixed"
    assert sum(r.change == "fixed" for r in z3_rows) == 4
    assert [(r.scenario, r.property) for r in z3_rows if r.change == "broken"] == [
        ("decode-reject", "answered-without-timeout")]


def test_guard_check_leads_with_the_answer(tmp_path):
    """The counts and the broken and fixed cells (with their traces) first;
    the unchanged cells collapsed to one line unless --all; the JSON has the
    counts first and its cells broken first."""
    args = ("guard", "check", str(EX / "naive-door-on-0.5.20.py"), "--scenario",
            "retract-abort,incident", "--no-cost", "--out", str(tmp_path / "out"))
    r = run(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("proposal ")
    # still violated: 0.5.20's three, and session-mark-released on
    # retract-abort (a client abort in decode's prealloc queue, which no
    # door decides)
    assert lines[1].startswith("BROKEN: 2, fixed: 1, still violated: 4, still hold: ")
    body = r.stdout[:r.stdout.index("unchanged:")]
    assert body.index("│ broken") < body.index("│ fixed")
    assert "still-violated" not in body and "still-holds" not in body
    assert "release-exactly-once" in body and "steps)" in body  # with its trace
    everything = run(*args, "--all").stdout
    assert "still-holds" in everything and "still-violated" in everything
    assert everything.index("│ broken") < everything.index("│ fixed") \
        < everything.index("still-violated") < everything.index("still-holds")
    data = json.loads(run(*args, "--json").stdout)
    assert list(data)[0] == "summary" and data["summary"]["broken"] == 2
    changes = [x["change"] for x in data["results"]]
    assert changes == sorted(changes, key=["broken", "fixed", "no-longer-applies",
                                           "still-violated", "still-holds",
                                           "not-applicable"].index)


def test_guard_points_lists_the_proposal_fields_and_guard_diff_compares_them():
    from reqmodel.proposals.proposal import FIELDS
    r = run("guard", "points")
    assert r.returncode == 0, r.stderr
    for name, (kind, _) in FIELDS.items():
        assert name in r.stdout and kind in r.stdout, (name, kind)
    r = run("guard", "diff", "0.5.20", str(EX / "pr38935-on-0.5.20.py"), "--no-reach",
            "--point", "retire_cleanup", "--point", "scenario_overrides", "--json")
    assert r.returncode == 0, r.stderr
    by = {p["name"]: p for p in json.loads(r.stdout)["guard_points"]}
    assert by["retire_cleanup"]["status"] == "differs"
    assert by["retire_cleanup"]["a"] == "none" and "session" in by["retire_cleanup"]["b"]
    assert by["scenario_overrides"]["status"] == "same"
    r = run("guard", "diff", "0.5.21", str(EX / "kv-checksum-both-roles.py"), "--no-reach",
            "--json")
    by = {p["name"]: p for p in json.loads(r.stdout)["guard_points"]}
    assert by["scenario_overrides"]["status"] == "differs" and by["checksum"]["status"] == "same"


def test_a_property_the_proposal_makes_inapplicable_is_not_called_fixed(tmp_path):
    """Deferred release turned off: the properties of the hold no longer
    apply, which is neither fixed nor still holding; the violations that
    stay are still violated, and the summary line counts the cells apart."""
    path = tmp_path / "no-deferral.py"
    path.write_text('base = "0.5.21"\n'
                    'scenario_overrides = {"options": {"deferred_release": False}}\n')
    prop = proposal.load(str(path))
    rows = {r.property: r for r in guardcheck.compare(
        prop, [scenario.builtin("inflight-reuse")], properties.select([]),
        pathlib.Path("unused"), pending=[])}
    assert rows["drain-ack-releases-hold"].base_verdict == "holds"
    assert rows["drain-ack-releases-hold"].change == "no-longer-applies"
    assert rows["reentry-can-resume"].change == "not-applicable"
    assert rows["session-mark-released"].change == "not-applicable"  # no sessions
    assert rows["no-foreign-kv-read"].change == "still-violated"
    assert not [r for r in rows.values() if r.change == "fixed"]
    r = run("guard", "check", str(path), "--scenario", "inflight-reuse", "--no-cost",
            "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "no longer applies: " in r.stdout and "not applicable: 2" in r.stdout


def test_a_property_the_engine_cannot_decide_is_not_a_change(tmp_path):
    """With --engine z3 the liveness properties are not checked on either
    side (no state graph): 'not-checked', never 'fixed' or 'broken'."""
    r = run("guard", "check", str(EX / "pr38935-on-0.5.20.py"), "--engine", "z3", "--depth", "6",
            "--scenario", "both-reject", "--no-cost", "--json", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    by = {x["property"]: x for x in data["results"]}
    assert by["no-livelock"]["change"] == "not-checked"
    assert by["no-livelock"]["base_verdict"] == by["no-livelock"]["proposal_verdict"] == "not-checked"
    graph = {p.name for p in properties.CATALOG.values() if p.kind.on_graph}
    assert not [x for x in data["results"]
                if x["property"] in graph and x["change"] in ("fixed", "broken")
                and "not-checked" in (x["base_verdict"], x["proposal_verdict"])]
    assert data["summary"]["not-checked"] >= 1
