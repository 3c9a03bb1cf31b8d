"""Fixtures of the property suite (the shared explorations are in the root
conftest.py)."""
import pytest

from reqmodel.engines.hypothesis import engine as hypo

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

