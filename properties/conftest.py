"""Shared fixtures: each (release, scenario) pair is explored once per session."""
import functools

import pytest

from reqmodel import explore, hypo, mutants, properties, releases, scenario

# dev / ci / thorough, for `pytest --hypothesis-profile NAME` and HYPOTHESIS_PROFILE
hypo.register_profiles()


def hypothesis_profile_name(config) -> str:
    """The --hypothesis-profile option, else HYPOTHESIS_PROFILE, else ci."""
    import os
    opt = config.getoption("hypothesis_profile", default=None)
    return opt or os.environ.get("HYPOTHESIS_PROFILE", "ci")


@pytest.fixture(scope="session")
def hprofile(pytestconfig):
    return hypothesis_profile_name(pytestconfig)


@functools.lru_cache(maxsize=None)
def exploration(release_name: str, scenario_name: str):
    rel = mutants.MUTANTS.get(release_name) or releases.get(release_name)
    return explore.explore(rel, scenario.builtin(scenario_name),
                           properties.select([]), keep_graph=False)


@pytest.fixture(scope="session")
def explored():
    return exploration
