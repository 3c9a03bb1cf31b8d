"""Fixtures shared by tests/ and properties/: each (release, scenario) pair is
explored once per pytest process, whichever test asks first (the corpus,
verdict and dead-action checks and, when they run in the same process, the
conformance cases all read the same explorations; the states are kept for
the last, about 0.6 KB each, 910,333 in all).  The explorations run to
exhaustion: the dead-action check and the conformance cases need every
reachable state and edge, and on the built-in scenarios no exploration stops
early anyway (measured), so the verdicts are the same."""
import functools

import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.proposals import mutants
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario


@functools.lru_cache(maxsize=None)
def exploration(release_name: str, scenario_name: str):
    rel = mutants.MUTANTS.get(release_name) or releases.get(release_name)
    return explore.explore(rel, scenario.builtin(scenario_name),
                           properties.select([]), stop_early=False, keep_graph=False,
                           keep_states=True)


@pytest.fixture(scope="session")
def explored():
    return exploration


def pytest_collection_modifyitems(config, items):
    """Every test that reads the shared explorations (the ``explored``
    fixture; the conformance tests read them too) is in one xdist group, so
    that ``pytest -n N --dist loadgroup`` makes the explorations once, on one
    worker, while the other workers take the rest of the suite (README)."""
    for it in items:
        if "explored" in getattr(it, "fixturenames", ()):
            it.add_marker(pytest.mark.xdist_group("explored"))
