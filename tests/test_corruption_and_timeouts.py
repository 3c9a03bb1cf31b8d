"""Issue #23's catalog gaps: a good transfer is never failed as corrupted
(``no-false-corruption-abort``), and the scheduler's own waiting timeout
(``SGLANG_REQ_WAITING_TIMEOUT``) as a step of its own."""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties, releases, scenario
from reqmodel.model.actions import Ctx, Step, apply
from reqmodel.model.state import DStage, PStage
from steps import run_steps

P = properties.CATALOG
LAYOUTS = scenario.builtin("checksum-layouts")
TIMEOUT = scenario.builtin("req-waiting-timeout")


def verdict(release, sc, name):
    ex = explore.explore(releases.get(release), sc, (P[name],), stop_early=False,
                         keep_graph=P[name].kind in ("always-possibly", "eventually"))
    v = ex.verdicts[name]
    return str(v.verdict), v.trace_length


# request 0 transferred and committed: its first decode step is next
COMMITTED = (
    Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0), Step("d_door", 0),
    Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0),
    Step("p_pop_bootstrapped", 0), Step("p_forward", 0), Step("p_result", 0),
    Step("xfer_dequeue", 0), Step("xfer_write", 0), Step("d_recv_status", 0),
    Step("d_transferred", 0))


@pytest.mark.parametrize("release,expected", [
    ("0.5.19", ("holds", None)), ("0.5.20", ("holds", None)), ("0.5.21", ("violated", 14)),
    ("0.5.22", ("violated", 14)), ("0.5.23", ("holds", None))])
def test_digests_of_different_layouts_fail_every_good_transfer_until_0_5_23(release, expected):
    assert verdict(release, LAYOUTS, "no-false-corruption-abort") == expected


def test_the_abort_is_the_checksum_and_the_pages_were_the_requests_own():
    ctx = Ctx(releases.get("0.5.21"), LAYOUTS)
    s = run_steps(ctx, COMMITTED)
    assert all(s.d_pages[p].written_by(0) for p in s.d[0].pages)
    nxt, evs = apply(ctx, s, Step("d_attend", 0))
    assert [e.kind for e in evs][:1] == ["corruption-abort"] and evs[0].check == "checksum"
    assert nxt.d[0].answer == 500
    # the same layouts: the digests agree and the request is decoded
    same = Ctx(releases.get("0.5.21"), attrs.evolve(LAYOUTS, layouts_match=True))
    _, evs = apply(same, run_steps(same, COMMITTED), Step("d_attend", 0))
    assert "corruption-abort" not in [e.kind for e in evs]


def test_a_real_corruption_abort_is_not_flagged():
    """auto-truncate-checksum: decode's digest covers a page prefill never
    wrote, so its checksum abort is right."""
    sc = scenario.builtin("auto-truncate-checksum")
    assert verdict("0.5.21", sc, "no-false-corruption-abort") == ("holds", None)
    assert verdict("0.5.21", sc, "no-foreign-kv-read") == ("holds", None)


def test_the_property_reads_the_abort_event_it_is_about():
    e = properties.ev.CorruptionAbort(0, "decode", "checksum")
    ctx = Ctx(releases.get("0.5.21"), LAYOUTS)
    s = run_steps(ctx, COMMITTED)
    assert not properties._corruption_was_real(e, s, s)
    foreign = attrs.evolve(s, d=(attrs.evolve(s.d[0], expected_checksum=(1, 0, 1)),))
    assert properties._corruption_was_real(e, foreign, foreign)


def test_the_waiting_timeout_is_prefills_abort_from_0_5_20():
    head = (Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0), Step("d_door", 0),
            Step("d_prealloc", 0, (0, (0,))), Step("p_recv_metadata", 0),
            Step("p_pop_bootstrapped", 0))
    old = Ctx(releases.get("0.5.19"), TIMEOUT)
    assert apply(old, run_steps(old, head), Step("p_req_waiting_timeout", 0)) is None
    new = Ctx(releases.get("0.5.21"), TIMEOUT)
    s = run_steps(new, head)
    assert s.p[0].stage is PStage.WAITING
    nxt, _ = apply(new, s, Step("p_req_waiting_timeout", 0))
    assert nxt.p[0].stage is PStage.GONE and nxt.p[0].answer == 503
    assert nxt.d[0].stage is DStage.TRANSFER  # decode hears nothing


def test_the_waiting_timeout_on_decode_releases_the_committed_request():
    ctx = Ctx(releases.get("0.5.21"), TIMEOUT)
    s = run_steps(ctx, COMMITTED)
    nxt, _ = apply(ctx, s, Step("d_req_waiting_timeout", 0))
    assert nxt.d[0].stage is DStage.GONE and nxt.d[0].answer == 503 and not nxt.d[0].pages


@pytest.mark.parametrize("release,expected", [
    ("0.5.19", ("holds", None)), ("0.5.20", ("violated", 8)), ("0.5.23", ("violated", 8))])
def test_decode_holds_after_prefills_waiting_timeout(release, expected):
    assert verdict(release, TIMEOUT, "abort-released-without-timeout") == expected
