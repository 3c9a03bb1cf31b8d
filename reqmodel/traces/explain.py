"""What could have caught a violation, and why it did not (``reqmodel
show``): the decisions the release's guard points took along the trace,
recorded by replaying it with each guard point wrapped (no list kept by
hand: whatever the effects call is what is shown), and, for a property of
the write-up's transfer-read gate, whether the KV checksum could compare
anything in this release and scenario."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import attrs

from reqmodel.model.actions import Ctx, Step
from reqmodel.model.actions.core import apply, initial_state
from reqmodel.model.guards import GUARD_POINTS
from reqmodel.model.properties import CATALOG
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import Finish


def guard_calls(release: Release, scenario: Scenario,
                steps: Sequence[Step]) -> List[List[Tuple[str, str, Any]]]:
    """Per step: the guard points it consulted, as (point, implementation,
    what it returned)."""
    calls: List[List[Tuple[str, str, Any]]] = []

    def recorder(name: str, fn):
        impl = getattr(fn, "__name__", name).replace(name + "_", "")

        def record(*args):
            out = fn(*args)
            if calls:
                calls[-1].append((name, impl, out))
            return out
        return record
    rel = attrs.evolve(release, **{n: recorder(n, getattr(release, n)) for n in GUARD_POINTS})
    ctx, s = Ctx(release=rel, scenario=scenario), initial_state(scenario)
    for step in steps:
        calls.append([])
        res = apply(ctx, s, step)
        if res is None:
            break
        s = res[0]
    return calls


def _show(value: Any) -> str:
    return str(value) if isinstance(value, Finish) else repr(value)


def checksum_line(release: Release, scenario: Scenario) -> str:
    """Whether the KV checksum could have compared this transfer."""
    flag = "--disaggregation-enable-kv-checksum"
    if release.checksum is None:
        return (f"KV checksum: none in {release.name} (it comes in 0.5.21, sglang#39500), so "
                "nothing compares what decode reads with what prefill sent")
    on = [role for role in ("prefill", "decode") if getattr(scenario, role).kv_checksum]
    if len(on) < 2:
        off = " and ".join(r for r in ("prefill", "decode") if r not in on)
        return (f"KV checksum: off on {off} ({flag} on both roles is what compares: "
                "on one role it protects nothing)")
    if not scenario.layouts_match:
        return (f"KV checksum: on both roles, but their KV layouts differ, so the digests "
                f"cannot agree ({release.checksum.name})")
    return (f"KV checksum: on both roles over matching layouts ({release.checksum.name}); "
            "what it digests did not show the difference")


def lines(release: Release, scenario: Scenario, prop: str, steps: Sequence[Step]) -> List[str]:
    """The guard decisions along the trace, and the checksum's part."""
    out, points = [], []
    for k, (step, calls) in enumerate(zip(steps, guard_calls(release, scenario, steps)),
                                       start=1):
        seen = []
        for name, impl, value in calls:
            text = f"{name} ({impl}) -> {_show(value)}"
            if text not in seen:
                seen.append(text)
            if name not in points:
                points.append(name)
        if seen:
            out.append(f"step {k} {step}: " + "; ".join(seen))
    out += [f"({name}: {GUARD_POINTS[name].meaning})" for name in points]
    p = CATALOG.get(prop)
    if p is not None and p.gate == "transfer-read":
        out.append(checksum_line(release, scenario))
    return out
