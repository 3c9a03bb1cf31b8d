"""Guard points as Z3 formulas: the encoding agrees with the Python guard on
every request, covers every value the model produces, and ``guard diff``
finds what the releases changed."""
import glob
import json
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reqmodel.model import guards as g
from reqmodel.proposals import mutants
from reqmodel.proposals import proposal
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.engines.z3 import guard_diff as symbolic
from reqmodel.cli.commands import main


def implementations():
    """Every distinct implementation of every guard point: releases, mutants,
    example proposals."""
    seen = {}
    records = list(releases.RELEASES.values()) + list(mutants.MUTANTS.values())
    records += [proposal.load(p).release for p in sorted(glob.glob("notes/examples/*.py"))]
    for rec in records:
        for gp, fn in rec.guard_points().items():
            seen.setdefault((gp, symbolic.unwrap(fn)), fn)
    return [(gp, fn) for (gp, _), fn in seen.items()]


IMPLS = implementations()


def value(dom):
    kind, spec = dom
    if kind == "const":
        return st.just(spec)
    if kind == "enum":
        return st.sampled_from(spec)
    if kind == "optional":
        return st.sampled_from([None, (0, 0, 2)])
    return st.integers(spec, spec + 6)


@st.composite
def call(draw, gp_name):
    args = []
    for a, fields in symbolic.arg_domains(gp_name).items():
        if "" in fields:
            args.append(draw(value(fields[""])))
        else:
            args.append(types.SimpleNamespace(**{f: draw(value(d)) for f, d in fields.items()}))
    return args


@pytest.mark.parametrize("gp,fn", IMPLS, ids=[f"{gp}-{symbolic._name(symbolic.unwrap(fn))}"
                                              for gp, fn in IMPLS])
def test_the_formula_agrees_with_the_guard_on_every_request(gp, fn):
    ps = symbolic.paths(gp, fn)

    @settings(max_examples=150, deadline=None, database=None)
    @given(call(gp))
    def agree(args):
        a = symbolic.assignment(gp, args)
        taken = [p for p in ps if symbolic.holds(p.cond, a)]
        assert len(taken) == 1, (a, [str(p.cond) for p in taken])  # paths partition the space
        assert taken[0].result == symbolic.unwrap(fn)(*args)
    agree()


def test_every_view_field_and_argument_has_a_domain():
    for view, fields in g.VIEWS.items():
        assert set(symbolic.FIELD_DOMAINS[view]) == set(fields), view
    for gp in g.GUARD_POINTS.values():
        for a in gp.args:
            assert (gp.name, a) in g.VIEW_OF_ARG or a in symbolic.PLAIN_ARGS


def test_every_value_the_model_passes_a_guard_is_in_its_domain():
    # assignment() raises on a value outside the domain (e.g. a new Finish)
    calls = symbolic.observed(releases.get("0.5.21"),
                              [scenario.builtin(n) for n in ("incident", "retract-abort",
                                                             "optimistic-abort", "pause-abort")],
                              max_states=200_000)
    assert all(calls[gp] for gp in ("prefill_door", "decode_door", "final_result",
                                    "middle_result", "inflight_success", "commit_check"))


def test_the_38935_door_retires_the_rejected_intake_stub():
    rel20, rel21 = releases.get("0.5.20"), releases.get("0.5.21")
    regions = symbolic.diff_point("prefill_door", rel20.prefill_door, rel21.prefill_door)
    assert {(r.a, r.b) for r in regions} == {(False, True)}
    fields = {f for r in regions for f in r.fields}
    assert "req.to_finish is a FINISH_ABORT (any status)" in fields
    assert {"req.is_retracted = False", "req.holds_kv = False",
            "req.metadata_buffer_index < 0"} <= fields
    calls = symbolic.observed(rel20, [scenario.builtin("incident")], 200_000)
    reached = {tuple(r.fields): symbolic.reached(r, calls["prefill_door"]) for r in regions}
    assert any("to_finish is a FINISH_ABORT" in f[0] and sc == ["incident"]
               for f, sc in reached.items())


def test_an_equivalent_rewrite_is_equivalent_and_a_changed_one_is_not():
    def demorgan(req):
        return g.is_aborted(req) and not req.is_retracted and not req.holds_kv \
            and not req.holds_mamba and not (req.metadata_buffer_index >= 0) \
            and not req.retraction_backup

    def off_by_one(req):
        return g.is_aborted(req) and not req.is_retracted and not req.holds_kv \
            and not req.holds_mamba and req.metadata_buffer_index < 1

    door = g.prefill_door_unadmitted_reject
    assert symbolic.equivalent("prefill_door", door, demorgan)
    assert not symbolic.equivalent("prefill_door", door, off_by_one)
    regions = symbolic.diff_point("prefill_door", door, off_by_one)
    assert regions
    for r in regions:  # only the slot index 0 is treated differently
        assert r.witness["req.metadata_buffer_index"] == 0 and (r.a, r.b) == (False, True)


def test_the_naive_door_differs_exactly_on_reentering_requests():
    naive = proposal.load("notes/examples/naive-door-on-0.5.20.py").release
    fixed = proposal.load("notes/examples/pr38935-on-0.5.20.py").release
    regions = symbolic.diff_point("prefill_door", naive.prefill_door, fixed.prefill_door)
    assert regions and all((r.a, r.b) == (True, False) for r in regions)
    for r in regions:  # each names an abort and one resource or re-entry marker
        assert any("FINISH_ABORT" in f for f in r.fields)
        assert any(m in f for f in r.fields for m in
                   ("is_retracted = True", "holds_kv = True", "holds_mamba = True",
                    "metadata_buffer_index >= 0"))


@pytest.mark.parametrize("body,message", [
    ("return [0, 1][req.origin_pages] == 1", "uses an integer field as an index"),
    ("return None if slot.checksum == (1,) else None", "opaque"),
    ("return req.origin_pages", "returns an integer field"),
    ("return 'yes'", "must return"),
])
def test_guards_that_cannot_be_encoded_are_one_line_errors(body, message):
    ns = {}
    exec(f"def commit_check(req, slot, expected_room):\n    {body}\n", ns)
    with pytest.raises(symbolic.SymbolicError, match=message) as exc:
        symbolic.paths("commit_check", ns["commit_check"])
    assert "\n" not in str(exc.value)


def test_guard_diff_cli_json(capsys):
    with pytest.raises(SystemExit) as e:
        main(["guard", "diff", "0.5.19", "0.5.20", "--no-reach", "--json"])
    assert e.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    by = {p["name"]: p for p in out["guard_points"]}
    assert by["prefill_door"]["status"] == "same"
    assert by["final_result"]["status"] == "differs"
    assert {(r["a"], r["b"]) for r in by["final_result"]["regions"]} == {("False", "True")}
    assert by["middle_result"]["status"] == "differs"


def test_guard_diff_cli_bad_input(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["guard", "diff", "0.5.19", "0.6.0", "--no-reach"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown release" in err and err.count("\n") == 1
    bad = tmp_path / "bad.py"
    bad.write_text("base = '0.5.21'\ndef prefill_door(req):\n    return [1, 2][req.origin_pages] == 2\n")
    with pytest.raises(SystemExit) as e:
        main(["guard", "diff", "0.5.21", str(bad), "--no-reach"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "cannot be encoded" in err and err.count("\n") == 1


EQUIVALENT_DOOR = '''"""#38935's prefill door written out by hand."""
from reqmodel.proposals import is_aborted
base = "0.5.21"


def prefill_door(req):
    if not is_aborted(req):
        return False
    return not (req.is_retracted or req.holds_kv or req.holds_mamba
                or req.metadata_buffer_index >= 0 or bool(req.retraction_backup))
'''


def test_guard_check_skips_exploration_when_z3_proves_the_proposal_changes_nothing(
        capsys, tmp_path):
    f = tmp_path / "same.py"
    f.write_text(EQUIVALENT_DOOR)
    with pytest.raises(SystemExit) as e:
        main(["guard", "check", str(f), "--json", "--out", str(tmp_path / "out")])
    assert e.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["same_as_base"] and out["results"] == []
    assert [p["status"] for p in out["first_pass"]] == ["equivalent"]


def test_guard_check_reports_the_first_pass_and_still_explores(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["guard", "check", "notes/examples/pr38935-on-0.5.20.py", "--scenario", "incident",
              "--no-cost", "--json", "--out", str(tmp_path / "out")])
    assert e.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert not out["same_as_base"]
    assert {p["name"]: p["status"] for p in out["first_pass"]} == {
        "prefill_door": "differs", "decode_door": "differs"}
    assert any(r["change"] == "fixed" for r in out["results"])
