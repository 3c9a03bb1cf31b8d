"""The Z3 engine against the exhaustive one (issue #7): on every release and
built-in scenario, bounded model checking to a small depth gives the same
verdicts as breadth-first exploration restricted to that depth.  A
violation (or reach) of length k within the bound is found by Z3 at depth k
exactly, with a trace that replays (``bmc.run`` replays every trace it
reports); nothing else is found; and a proof (no simple path left) is only
given where the exploration's verdict is the same at every depth."""
import pytest

from reqmodel import bmc, properties, releases, scenario

DEPTH = 6
PAIRS = [(rel, sc) for sc in scenario.builtin_names() for rel in releases.NAMES]


@pytest.mark.parametrize("release,sc", PAIRS)
def test_z3_agrees_with_exhaustive_search_to_a_small_depth(explored, release, sc):
    rel, scen = releases.get(release), scenario.builtin(sc)
    props = [p for p in properties.CATALOG.values() if p.applies(rel, scen)]
    ex = explored(release, sc)
    got = bmc.run(rel, scen, props, DEPTH)
    for p in props:
        v, r = ex.verdicts[p.name], got[p.name]
        n = v.trace_length
        if v.trace is not None and n <= DEPTH:
            assert (r.verdict, r.depth) == ("reached" if p.kind == "sometimes" else "violated", n), p.name
            assert len(r.trace.steps) == n
        elif r.verdict in ("proved", "unreachable"):
            # no simple path of r.depth steps: the whole space is within it
            assert ex.depth < r.depth, p.name
            assert v.verdict == ("violated" if p.kind == "sometimes" else "holds"), p.name
        else:
            assert (r.verdict, r.depth) == (
                "unreached-to-depth" if p.kind == "sometimes" else "holds-to-depth", DEPTH), p.name
