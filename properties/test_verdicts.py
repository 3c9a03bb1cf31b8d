"""The verdict table, checked cell by cell against the exhaustive explorer."""
import pytest

from reqmodel.model import properties

from verdict_table import ESTABLISHED, MUTANT_CELLS, REFERENCE, RELEASES


def cell(verdict) -> str:
    if verdict.verdict == "not-applicable":
        return "-"
    if verdict.kind == "sometimes":
        return f"R{verdict.trace_length}" if verdict.verdict == "holds" else "U"
    return "H" if verdict.verdict == "holds" else f"F{verdict.trace_length}"


REFERENCE_CASES = [(prop, sc, rel, cells[i])
                   for prop, (sc, cells) in REFERENCE.items() for i, rel in enumerate(RELEASES)]
ESTABLISHED_CASES = [(prop, sc, rel, cells[i])
                     for (prop, sc), cells in ESTABLISHED.items() for i, rel in enumerate(RELEASES)]


@pytest.mark.parametrize("prop,scenario,release,expected", REFERENCE_CASES,
                         ids=[f"{p}-{r}" for p, s, r, e in REFERENCE_CASES])
def test_reference_table(explored, prop, scenario, release, expected):
    assert cell(explored(release, scenario).verdicts[prop]) == expected


@pytest.mark.parametrize("prop,scenario,release,expected", ESTABLISHED_CASES,
                         ids=[f"{p}-{s}-{r}" for p, s, r, e in ESTABLISHED_CASES])
def test_established_cells(explored, prop, scenario, release, expected):
    assert cell(explored(release, scenario).verdicts[prop]) == expected


@pytest.mark.parametrize("mutant,prop,scenario", sorted(MUTANT_CELLS))
def test_mutants_break_properties(explored, mutant, prop, scenario):
    got = cell(explored(mutant, scenario).verdicts[prop])
    assert got.startswith(MUTANT_CELLS[(mutant, prop, scenario)])


def test_every_safety_property_fails_somewhere():
    """No vacuous property: each safety property is violated on some release
    or mutant in the tables above."""
    failing = {p for p, (sc, cells) in REFERENCE.items() if any(c.startswith("F") for c in cells)}
    failing |= {p for (p, sc), cells in ESTABLISHED.items() if any(c.startswith("F") for c in cells)}
    failing |= {p for (m, p, sc), c in MUTANT_CELLS.items() if c == "F"}
    assert {p.name for p in properties.SAFETY} <= failing


def test_every_liveness_property_fails_somewhere():
    """No vacuous liveness property: each is violated on some release or mutant."""
    failing = {p for (p, sc), cells in ESTABLISHED.items() if any(c.startswith("F") for c in cells)}
    failing |= {p for (m, p, sc), c in MUTANT_CELLS.items() if c == "F"}
    assert {p.name for p in properties.LIVENESS} <= failing


def test_every_reachability_property_can_fail():
    failing = {p for (m, p, sc), c in MUTANT_CELLS.items() if c == "U"}
    assert {p.name for p in properties.REACHABILITY} <= failing


@pytest.mark.parametrize("release", RELEASES)
def test_reachability_holds_on_every_scenario_with_a_valid_request(explored, release):
    """... except where the table pins "U": a valid request that the release
    always fails (checksum-layouts on 0.5.21/0.5.22: every good transfer is
    aborted as corrupted)."""
    from reqmodel.model import scenario
    i = RELEASES.index(release)
    for name in scenario.builtin_names():
        v = explored(release, name).verdicts["valid-request-completes"]
        pinned = ESTABLISHED.get(("valid-request-completes", name))
        if pinned is not None and pinned[i] == "U":
            assert v.verdict == "violated", name
            continue
        assert v.verdict in ("holds", "not-applicable"), name
