"""The model's findings that are defects in the code, as data
(``reqmodel/findings.toml``): what a user needs before reporting one
upstream (configuration, timing, severity, the closest upstream record).
``reqmodel show --format report`` and ``tools/findings_md.py`` read it; the
releases each finding shows on come from the pinned verdict cells."""
from __future__ import annotations

import functools
import tomllib
from importlib import resources
from typing import Optional, Tuple

import attrs

# "failure": a valid request fails (an error the client sees) though nothing went wrong
# "misreport": the request ends as it should, but the client or the operator
# is told another cause (a failure's 500 and its metric for a client's abort)
SEVERITIES = ("data-exposure", "crash", "hang", "failure", "waste", "latency", "misreport")
STATUSES = ("confirmed", "plausible")


@attrs.frozen
class Finding:
    id: str
    title: str
    property: str
    scenario: str
    severity: str = attrs.field(validator=attrs.validators.in_(SEVERITIES))
    status: str = attrs.field(validator=attrs.validators.in_(STATUSES))
    configuration: str
    timing: str
    upstream: Tuple[str, ...] = attrs.field(converter=tuple)
    summary: str
    fix: str  # what an operator can change (a flag, a variable, a release, the router)
    # where the reading is narrower than the failing cells; () = all of them
    releases: Tuple[str, ...] = attrs.field(default=(), converter=tuple)
    # "role:NAME=value" settings without which a trace of it departs from the
    # real code (reqmodel conform --trace); reqmodel audit warns instead of
    # failing on a deployment that lacks one
    requires_env: Tuple[str, ...] = attrs.field(default=(), converter=tuple)
    # other scenarios whose violation of the property is this finding's
    # mechanism (read in notes/verdicts.md); the releases stay the main cell's
    also_in: Tuple[str, ...] = attrs.field(default=(), converter=tuple)


@functools.lru_cache(maxsize=1)
def load() -> Tuple[Finding, ...]:
    data = tomllib.loads(resources.files("reqmodel").joinpath("findings.toml").read_text("utf-8"))
    return tuple(Finding(**entry) for entry in data["finding"])


def lookup(prop: str, scenario: str) -> Optional[Finding]:
    """The finding a trace of ``prop`` on ``scenario`` shows, if it is one."""
    return next((f for f in load() if f.property == prop
                 and (f.scenario == scenario or scenario in f.also_in)), None)
