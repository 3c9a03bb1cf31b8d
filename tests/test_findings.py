"""The findings registry (reqmodel/findings.toml) names real properties,
scenarios and pinned failing cells; `show --format report` carries what a
user needs to report one upstream; the Findings section and the reports
under notes/findings/ are what tools/findings_md.py generates."""
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from reqmodel import findings
from reqmodel.cli.commands import cli
from reqmodel.model import properties, scenario

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import findings_md  # noqa: E402

ALL = findings.load()


def test_ids_are_unique_and_each_property_scenario_pair_is_one_finding():
    assert len({f.id for f in ALL}) == len(ALL)
    assert len({(f.property, f.scenario) for f in ALL}) == len(ALL)


@pytest.mark.parametrize("f", ALL, ids=[f.id for f in ALL])
def test_each_finding_is_a_pinned_violation_with_a_trace_and_an_upstream_record(f):
    assert f.property in properties.CATALOG
    assert f.scenario in scenario.builtin_names()
    rels, row = findings_md.releases_of(f)  # raises where the property holds
    assert rels and all(row[r].startswith("F") for r in rels)
    assert (ROOT / findings_md.trace_of(f, rels[-1])).exists()
    assert f.upstream and f.configuration and f.timing and f.summary


@pytest.mark.parametrize("f", ALL, ids=[f.id for f in ALL])
def test_each_finding_names_the_timeout_settings_its_traces_need(f):
    """Every timing relation a finding's corpus traces need (``clocks.needs``,
    derived from the steps) is named in its configuration."""
    from reqmodel.traces import replay as rp
    rels, _ = findings_md.releases_of(f)
    for sc in (f.scenario, *f.also_in):
        for rel in rels:
            path = ROOT / "counterexamples" / rel / f"{f.property}-{sc}.itf.json"
            if not path.exists():
                continue
            for need in rp.run(rp.load(path)).timing:
                assert need.longer in f.configuration and need.shorter in f.configuration, (
                    path, str(need))


def test_the_report_carries_the_configuration_the_table_and_the_diagram():
    f = findings.lookup("abort-released-without-timeout", "abort-reaches-prefill")
    res = CliRunner().invoke(cli, ["show", str(ROOT / "counterexamples/0.5.21/"
                                   "abort-released-without-timeout-abort-reaches-prefill.itf.json"),
                                   "--format", "report"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.startswith(f"## {f.title}")
    for text in (f.configuration, f.summary, "#28651", "| # | actor | action |", "```mermaid",
                 "sequenceDiagram", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "reqmodel replay"):
        assert text in out, text


def test_a_trace_that_is_no_recorded_finding_says_so():
    res = CliRunner().invoke(cli, ["show", str(ROOT / "counterexamples/0.5.19/"
                                   "transfer-status-monotone-pause-abort.itf.json"),
                                   "--format", "report"])
    assert res.exit_code == 0, res.output
    assert "not one of reqmodel's recorded findings" in res.output


def test_a_finding_on_a_cell_that_holds_is_refused(monkeypatch):
    bad = findings.Finding(id="x", title="x", property="no-foreign-kv-read", scenario="incident",
                           severity="waste", status="confirmed", configuration="c", timing="t",
                           upstream=["u"], summary="s", fix="f", releases=["0.5.21"])
    with pytest.raises(SystemExit, match="holds on"):
        findings_md.releases_of(bad)


def test_the_notes_are_what_the_generator_writes():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "findings_md.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
