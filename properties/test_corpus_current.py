"""The counterexample corpus is exactly what the checker finds today.

Fails when a violation in the verdict table has no trace, when a committed
trace is not the shortest one the checker finds now (stale), and when a trace
of a release starts violating its property on a later release whose verdict
is `holds` (a fix regressed).  Regenerate with:

    reqmodel check --release all --scenario all --out counterexamples
"""
import pathlib

import pytest

from reqmodel.traces import itf
from reqmodel.model import properties
from reqmodel.model import scenario

from verdict_table import ESTABLISHED, REFERENCE, RELEASES

ROOT = pathlib.Path(__file__).parent.parent / "counterexamples"


def _expected(explored):
    out = {}
    for name in scenario.builtin_names():
        for rel in RELEASES:
            ex = explored(rel, name)
            for p, v in ex.verdicts.items():
                if v.verdict == "violated" and properties.CATALOG[p].kind != "sometimes":
                    out[(rel, p, name)] = v.trace
    return out


def test_corpus_matches_the_checker(explored):
    expected = _expected(explored)
    on_disk = {}
    builtin = set(scenario.builtin_names())
    for path in ROOT.glob("*/*.itf.json"):
        meta, steps = itf.read(path)
        # `reqmodel check --scenario-file` writes here too by default; the
        # corpus is the built-in scenarios' traces
        if meta["scenario"] in builtin:
            on_disk[(meta["release"], meta["property"], meta["scenario"])] = steps
    missing = sorted(set(expected) - set(on_disk))
    extra = sorted(set(on_disk) - set(expected))
    assert not missing, f"violations without a committed trace: {missing}"
    assert not extra, f"committed traces of properties that now hold: {extra}"
    stale = sorted(k for k in expected if expected[k].steps != on_disk[k])
    assert not stale, f"stale traces (the shortest counterexample changed): {stale}"


def _holds_on(prop, sc, rel):
    for (p, s), cells in ESTABLISHED.items():
        if (p, s) == (prop, sc):
            return cells[RELEASES.index(rel)] == "H"
    ref = REFERENCE.get(prop)
    if ref and ref[0] == sc:
        return ref[1][RELEASES.index(rel)] == "H"
    return None


@pytest.mark.parametrize("path", sorted(ROOT.glob("*/*.itf.json")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixed_releases_do_not_violate_again(path):
    from reqmodel.traces import replay
    loaded = replay.load(path)
    later = RELEASES[RELEASES.index(loaded.release.name) + 1:]
    for rel in later:
        if not _holds_on(loaded.property.name, loaded.meta["scenario"], rel):
            continue
        out = replay.run(replay.load(path, rel))
        assert not out.violated, f"{path.name} violates again on {rel}"
