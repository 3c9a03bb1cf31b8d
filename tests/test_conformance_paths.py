"""Conformance on model-generated paths (``pytest -m conformance``): a step
that acts on what a KV manager's threads left behind is checked as the
shortest model path to each state where the model takes it, replayed on the
real code by the trace rig (``reqmodel/conform/pathcases.py``).  Needs the
environment that ``reqmodel conform --setup`` builds, as
``tests/test_conformance.py`` does; it reads no shared exploration, so CI runs
it in its second process."""
import pytest

from reqmodel import conform
from reqmodel.conform import pathcases
from reqmodel.conform import traces as traces_mod
from reqmodel.model import releases
from reqmodel.traces import itf

pytestmark = pytest.mark.conformance
RELEASES = releases.NAMES
ROOT = conform.DEFAULT_DIR


def _replays(root, cases):
    """Every release's model-generated ``cases(release)``, each written as a
    trace file and replayed on its release's code."""
    paths = []
    for rel in RELEASES:
        for i, (sc, t) in enumerate(cases(releases.get(rel))):
            path = root / rel / f"case{i:03d}-{sc.name}-{t.steps[-1].action}.itf.json"
            itf.write(path, t, sc)
            paths.append(str(path))
    return traces_mod.run(ROOT, paths)


@pytest.fixture(scope="module")
def failed_list_replays(tmp_path_factory):
    """The failed-session list's cases, replayed."""
    return _replays(tmp_path_factory.mktemp("failed-list"), pathcases.failed_list_cases)


@pytest.mark.parametrize("rel", RELEASES)
def test_the_failed_session_list_agrees_with_the_real_code_on_model_paths(rel,
                                                                         failed_list_replays):
    """At least 100 cases per release: the shortest paths to states where a
    failed batch lists decode's session (xfer_fail), a chunk to a listed
    session fails early (xfer_session_failed), or a probe pass takes it off
    (p_probe_failed_sessions), on transfer-failure(-probe), room-reuse-three
    and prefill-tp-failure; every step of every case agrees with the real
    code, the last one included."""
    got = [r for r in failed_list_replays if r.release == rel]
    assert len(got) >= 100
    bad = [(r.trace, r.divergence) for r in got if r.replayed != r.steps]
    assert bad == []
    ends = {r.trace.rsplit("-", 1)[1].split(".")[0] for r in got}
    assert ends == set(pathcases.FAILED_LIST_STEPS)


def test_a_path_ends_in_its_step_and_replays_on_the_model():
    """The cases are what they claim: each ends in one of the list's steps,
    and its steps replay on the model from the initial state."""
    from reqmodel.model.actions import core
    rel = releases.get("0.5.21")
    got = list(pathcases.failed_list_cases(rel, per_action=3))
    assert {t.steps[-1].action for _, t in got} == set(pathcases.FAILED_LIST_STEPS)
    for sc, t in got:
        ctx = core.Ctx(rel, sc)
        s = core.initial_state(sc)
        for step, want in zip(t.steps, t.states[1:]):
            s = core.apply(ctx, s, step)[0]
            assert s == want


@pytest.fixture(scope="module")
def node_failure_replays(tmp_path_factory):
    """Decode's node failure's cases, replayed."""
    return _replays(tmp_path_factory.mktemp("node-failure"), pathcases.node_failure_cases)


@pytest.mark.parametrize("rel", RELEASES)
def test_the_node_failure_agrees_with_the_real_code_on_model_paths(rel, node_failure_replays):
    """At least 100 whole cases per release of the real ``_handle_node_failure``:
    the shortest paths to states where decode's heartbeat declares a live
    prefill instance lost (prefill-silent) or a dead one (the instance
    serving both requests dies), and to the deaths themselves; every step of
    every case agrees with the real code, the last one included."""
    got = [r for r in node_failure_replays if r.release == rel]
    bad = [(r.trace, r.divergence) for r in got if r.replayed != r.steps]
    assert bad == []
    whole = [r for r in got if r.replayed == r.steps and "-p_dies" not in r.trace]
    assert len(whole) >= 100
    ends = {r.trace.rsplit("-", 1)[1].split(".")[0] for r in got}
    assert ends == {"d_heartbeat_lost", "d_node_failure", "p_dies"}


@pytest.fixture(scope="module")
def worker_raise_replays(tmp_path_factory):
    """The transfer worker's raise, replayed."""
    return _replays(tmp_path_factory.mktemp("worker-raise"), pathcases.worker_raise_cases)


@pytest.mark.parametrize("rel", RELEASES)
def test_a_raising_transfer_worker_agrees_with_the_real_code_on_model_paths(
        rel, worker_raise_replays):
    """At least 100 whole cases per release of the real ``transfer_worker``
    raising out of its loop (the rig's engine raises at the send): the
    shortest paths to states where the worker takes a chunk and raises, on
    transfer-worker-dies(-abort); the real handler re-raises "Transfer
    thread failed", the thread ends, and every step of every case agrees
    with the real code (the room counted outstanding, 0.5.22+ poisoned)."""
    got = [r for r in worker_raise_replays if r.release == rel]
    assert len(got) >= 100
    bad = [(r.trace, r.divergence) for r in got if r.replayed != r.steps]
    assert bad == []


def test_a_wait_nothing_ends_is_read_on_the_real_code():
    """``every-wait-bounded`` on the real objects: settled with every KV
    timeout made due, the n = 2 samples' trace leaves a client waiting on
    every release (a receiver latched the other sample's Success, which the
    metadata gate holds back); the mutant's trace, whose waiting timeout
    tells prefill nothing, does not on 0.5.20's real code, whose timeout
    sends the ABORT that ends prefill's wait."""
    import pathlib
    corpus = pathlib.Path(__file__).resolve().parent.parent / "counterexamples"
    paths = [str(corpus / rel / "every-wait-bounded-parallel-samples.itf.json")
             for rel in RELEASES]
    got = traces_mod.run(ROOT, paths)
    assert [(r.release, r.reproduced) for r in got] == [(rel, True) for rel in RELEASES]
    mutant = corpus / "mutants" / "silent-waiting-timeout"
    (res,) = traces_mod.run(ROOT, [str(next(mutant.glob("every-wait-bounded-*.itf.json")))],
                            release=releases.get("0.5.20"))
    assert res.replayed == res.steps and not res.reproduced
    assert res.divergence["why"] == "no-violation"


def test_a_client_abort_answered_as_a_failure_is_read_on_the_real_code():
    """``answer-matches-cause`` on the real objects: on every release the
    client's abort reaching decode's prealloc queue (prefill's bootstrap
    queue) is answered by the next scan with the failure's 500, whose real
    ``finished_reason`` the rig reads as a failure (``tracerig._cause``)."""
    import pathlib
    corpus = pathlib.Path(__file__).resolve().parent.parent / "counterexamples"
    paths = [str(corpus / rel / f"answer-matches-cause-abort-reaches-{side}.itf.json")
             for rel in RELEASES for side in ("decode", "prefill")]
    got = traces_mod.run(ROOT, paths)
    assert [r.reproduced for r in got] == [True] * len(paths)


def test_a_session_mark_left_set_is_read_on_the_real_code():
    """``session-mark-released`` on the real objects: each request carries a
    real streaming ``Session`` whose turn is in flight, and the real scans
    and aborts decide what reaches ``finish_req`` / ``abort_req`` (the rig's
    stand-in for ``release_kv_cache`` calls them only for a request holding
    KV, as the real call does).  On every release with PD session requests
    the client's abort in decode's prealloc queue (before 0.5.22 also in
    prefill's bootstrap queue) leaves the mark set.  Every corpus trace of a
    scenario with sessions compares the mark at each step as well
    (``traces.project``)."""
    import pathlib
    corpus = pathlib.Path(__file__).resolve().parent.parent / "counterexamples"
    rels = [r for r in RELEASES if releases.get(r).pd_session_requests]
    paths = [str(corpus / rel / f"session-mark-released-{name}.itf.json")
             for rel in rels for name in ("pause-abort", "retract-abort")]
    got = traces_mod.run(ROOT, paths)
    assert [r.reproduced for r in got] == [True] * len(paths), [r.divergence for r in got]
