"""The Z3 engine against the exhaustive one (issue #7): on every release and
built-in scenario, bounded model checking to a small depth gives the same
verdicts as breadth-first exploration restricted to that depth.  A
violation (or reach) of length k within the bound is found by Z3 at depth k
exactly, with a trace that replays (``bmc.run`` replays every trace it
reports); nothing else is found; and a proof (no simple path left) is only
given where the exploration's verdict is the same at every depth."""
import pytest

from reqmodel.engines.z3 import bmc
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario

DEPTH = 6
PAIRS = [(rel, sc) for sc in scenario.builtin_names() for rel in releases.NAMES]


@pytest.mark.parametrize("release,sc", PAIRS)
def test_z3_agrees_with_exhaustive_search_to_a_small_depth(explored, release, sc):
    rel, scen = releases.get(release), scenario.builtin(sc)
    # the liveness properties' deadlock forms are tests/test_liveness.py's
    props = [p for p in properties.CATALOG.values()
             if p.applies(rel, scen) and not p.kind.on_graph]
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


# Past the agreement depth, one pinned cell of each kind the table has at 7 to
# 9 steps: Z3's first depth is the pinned shortest length.
DEEPER = [("transfer-status-monotone", "late-result", "0.5.19"),
          ("drain-ack-reaches-every-rank", "two-rank-abort", "0.5.19"),
          ("drain-ack-releases-hold", "room-reuse", "0.5.21"),
          ("no-late-result-side-effects", "late-result-unit", "0.5.19")]


@pytest.mark.parametrize("prop,sc,release", DEEPER)
def test_z3_first_depth_is_the_pinned_shortest_length(prop, sc, release):
    from verdict_table import ESTABLISHED, REFERENCE, RELEASES
    row = ESTABLISHED.get((prop, sc)) or REFERENCE[prop][1]
    cell = row[RELEASES.index(release)]
    assert cell[0] in "FR"
    n = int(cell[1:])
    assert n > DEPTH
    r = bmc.check(releases.get(release), scenario.builtin(sc), properties.CATALOG[prop], n)
    p = properties.CATALOG[prop]
    assert (r.verdict, r.depth) == ("reached" if p.kind == "sometimes" else "violated", n)
    assert len(r.trace.steps) == n
