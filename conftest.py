"""Fixtures shared by tests/ and properties/: each (release, scenario) pair is
explored once per pytest process, whichever test asks first (the corpus,
verdict and dead-action checks all read the same explorations)."""
import functools

import pytest

from reqmodel import explore, mutants, properties, releases, scenario


@functools.lru_cache(maxsize=None)
def exploration(release_name: str, scenario_name: str):
    rel = mutants.MUTANTS.get(release_name) or releases.get(release_name)
    return explore.explore(rel, scenario.builtin(scenario_name),
                           properties.select([]), keep_graph=False)


@pytest.fixture(scope="session")
def explored():
    return exploration
