"""Fixtures shared by tests/ and properties/: each (release, scenario) pair is
explored once per pytest process, whichever test asks first (the corpus,
verdict and dead-action checks and, when they run in the same process, the
conformance cases all read the same explorations; the states are kept for
the last, about 0.6 KB each, 910,333 in all).  The explorations run to
exhaustion: the dead-action check and the conformance cases need every
reachable state and edge, and on the built-in scenarios no exploration stops
early anyway (measured), so the verdicts are the same."""
import functools
import gc
import os
import pickle

import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.proposals import mutants
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario


def _explore(release_name: str, scenario_name: str, keep_states: bool = True):
    rel = mutants.MUTANTS.get(release_name) or releases.get(release_name)
    return explore.explore(rel, scenario.builtin(scenario_name),
                           properties.select([]), stop_early=False, keep_graph=False,
                           keep_states=keep_states)


# Under pytest-xdist (the default tier runs on every core) the workers share
# the explorations through files, each pair explored by one worker: the
# first worker that needs explorations takes, pair by pair, those no other
# worker holds a lock on, so the workers split the exploring, and a pair
# another worker is exploring is waited for and read. (xdist's loadgroup
# would keep the tests on one worker, but measured with xdist 3.8 it does not
# group them here: both dead-action tests explored everything, 175 s each.)
# The shared copies leave out the states, which only the conformance cases
# read, and CI runs those in one process (-n 0), where nothing is shared.
_SHARED = None  # under xdist: in pytest's temporary directory of the run, which the workers share


def _shared(release_name: str, scenario_name: str, block: bool):
    """The pair's exploration from the shared directory, exploring it here
    if no other worker is; None when ``block`` is false and one is."""
    import fcntl
    _SHARED.mkdir(exist_ok=True)
    done = _SHARED / f"{release_name}--{scenario_name}.pickle"
    if done.exists():
        return pickle.loads(done.read_bytes())
    with open(_SHARED / f"{release_name}--{scenario_name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        if done.exists():
            return pickle.loads(done.read_bytes())
        ex = _explore(release_name, scenario_name, keep_states=False)
        tmp = done.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(ex))
        os.replace(tmp, done)
        return ex


@functools.lru_cache(maxsize=None)
def exploration(release_name: str, scenario_name: str):
    if _SHARED is None:
        ex = _explore(release_name, scenario_name)
        # kept for the session: out of the collector's reach, so that every
        # later full collection does not walk the kept states again (about a
        # million records by the end of the explorations)
        gc.freeze()
        return ex
    if not getattr(exploration, "_prefetched", False):
        exploration._prefetched = True  # take a share of every built-in pair first
        for name in scenario.builtin_names():
            for rel in releases.NAMES:
                if (rel, name) != (release_name, scenario_name):
                    _shared(rel, name, block=False)
    return _shared(release_name, scenario_name, block=True)


@pytest.fixture(scope="session")
def explored(tmp_path_factory):
    global _SHARED
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's basetemp is .../pytest-N/popen-gwK
        _SHARED = tmp_path_factory.getbasetemp().parent / "explored"
    return exploration


# The slow tier (README, "Test"): `pytest` leaves these out, `pytest -m slow`
# runs them alone and CI runs everything. Chosen from a measured run of the
# whole suite (`pytest -n 2 --durations=0`, 2 cores, 2026-12-04): the
# Hypothesis and Z3 agreement suites, and the tests of the tool that take
# more than 20 s each in all (explorations of every scenario for symmetry
# and shortest lengths, the whole corpus through show / replay / itf-py, the
# Z3 engine's learned paths and formulas against the concrete model).
SLOW = (
    "properties/test_hypothesis.py",
    "properties/test_z3_agreement.py",
    "tests/test_symexec.py",
    "tests/test_architecture.py::test_every_engine_answers_in_the_one_vocabulary",
    "tests/test_explore.py::test_symmetry_reduction_keeps_verdicts_and_lengths",
    "tests/test_explore.py::test_counterexamples_are_shortest",
    "tests/test_replay_show.py::test_show_and_replay_work_on_the_whole_corpus",
    "tests/test_itf_interop.py::test_corpus_file_round_trips_through_itf_py",
    "tests/test_symbolic.py::test_the_formula_agrees_with_the_guard_on_every_request",
    "tests/test_prefill_tp.py::test_a_stale_report_completes_the_later_requests_response_count",
    "tests/test_audit.py::test_auto_truncate_",
    "tests/test_audit.py::test_checksum_across_layouts",
    # the second cut (#28's last stop, a quiet-machine run of the default
    # tier: 334 s with the new tests): the tool's tests over 8 s each
    "tests/test_guard.py::test_a_proposal_checked_by_z3_gets_the_exhaustive_engines_changes",
    "tests/test_cli.py::test_hypothesis_returns_within_its_budget_and_says_what_it_searched",
    "tests/test_cli.py::test_progress_is_shown_on_a_terminal_only",
    "tests/test_audit.py::test_0_5_20_mooncake_without_deferred_release_fails_lifetime",
    "tests/test_readme.py::test_the_audit_section_states_what_the_audit_prints",
    "tests/test_channels.py::test_the_in_flight_reuse_read_needs_two_transfer_workers",
    "tests/test_symbolic.py::test_an_equivalent_rewrite_is_equivalent_and_a_changed_one_is_not",
    "tests/test_hypo.py::test_a_budgeted_search_for_every_property_at_once",
    "tests/test_rooms.py::test_an_ack_sent_before_a_queued_chunk_frees_the_page_it_lands_in",
    "tests/test_rooms.py::test_a_client_abort_opens_the_popped_room_on_every_release_that_defers",
    "tests/test_explore.py::test_rank_symmetry_merges_states[prefill-tp-failure-0.5.19",
    # #27: the engines' shortcuts checked on every state of the larger scenarios
    "tests/test_fast_paths.py::test_no_guard_holds_without_its_needs_on_the_larger_scenarios",
    "tests/test_fast_paths.py::test_drafting_gives_the_successors_of_a_copy_per_change_everywhere",
)


def pytest_itemcollected(item):
    """The tests in ``SLOW`` get the ``slow`` marker (as each is collected)."""
    if item.nodeid.startswith(SLOW):
        item.add_marker(pytest.mark.slow)


# CI builds the conformance environment while the suite runs (.ci/run): with
# REQMODEL_CONFORM_WAIT set (a file the setup writes its exit status to when
# it ends), the conformance tests run last and the first of them waits for it.
_CONFORM_WAIT = os.environ.get("REQMODEL_CONFORM_WAIT")


def pytest_collection_modifyitems(config, items):
    if _CONFORM_WAIT:
        items.sort(key=lambda item: item.get_closest_marker("conformance") is not None)


@pytest.fixture(autouse=True)
def _conformance_environment_built(request):
    if _CONFORM_WAIT and request.node.get_closest_marker("conformance") is not None:
        _wait_for_setup(_CONFORM_WAIT)


@functools.lru_cache(maxsize=None)
def _wait_for_setup(path: str, hours: float = 1.0) -> None:
    import time
    deadline = time.monotonic() + hours * 3600
    while not os.path.exists(path) or not open(path).read().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"the conformance environment's setup did not end in {hours} h")
        time.sleep(2)
    status = open(path).read().strip()
    if status != "0":
        pytest.fail(f"the conformance environment's setup failed (exit {status}); its log "
                    "follows the suite's in CI's output")
