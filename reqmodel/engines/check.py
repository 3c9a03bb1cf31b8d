"""``reqmodel check``: run the property catalog on releases x scenarios."""
from __future__ import annotations

import pathlib
from typing import Iterable, List, Optional, Sequence

import attrs

from reqmodel.traces import itf
from reqmodel.engines.exhaustive import DEFAULT_MAX_STATES, Exploration, Verdict, explore
from reqmodel.model.properties import Property
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario


@attrs.frozen
class Result:
    release: str
    scenario: str
    property: str
    kind: str
    verdict: str
    trace_length: Optional[int]
    trace_file: Optional[str]
    states: Optional[int]
    seconds: float
    engine: str = "exhaustive"
    examples: Optional[int] = None  # hypothesis: test cases run
    steps: Optional[int] = None  # hypothesis: model steps executed
    runs: Optional[int] = None  # hypothesis: runs of the scenario (several per test case)
    depth: Optional[int] = None  # z3: the depth searched
    clauses: Optional[int] = None  # z3: paths of the actions learned
    refinements: Optional[int] = None  # z3: sequences into states with a path not learned yet
    proved: bool = False  # z3: the verdict holds for every depth (no simple path was left)

    def as_json(self) -> dict:
        out = {"release": self.release, "scenario": self.scenario, "property": self.property,
               "verdict": self.verdict, "trace_length": self.trace_length,
               "trace_file": self.trace_file, "states": self.states,
               "seconds": round(self.seconds, 3)}
        if self.engine == "hypothesis":
            out.update(engine="hypothesis", examples=self.examples, runs=self.runs,
                       steps=self.steps)
        if self.engine == "z3":
            out.update(engine="z3", depth=self.depth, proved=self.proved, clauses=self.clauses,
                       refinements=self.refinements)
        return out


def trace_path(out: pathlib.Path, release: str, prop: str, scenario: str) -> pathlib.Path:
    return out / release / f"{prop}-{scenario}.itf.json"


def _write_trace(v: Verdict, out: Optional[pathlib.Path], rel: Release, sc: Scenario,
                 write_witnesses: bool, engine: str = "exhaustive",
                 extra_meta: Optional[dict] = None) -> Optional[str]:
    """Write a violation's counterexample (and, if asked, a reachability
    witness) under ``out``; return its path."""
    if v.trace is None or out is None or not (v.verdict == "violated" or write_witnesses):
        return None
    path = trace_path(out, rel.name, v.property, sc.name)
    itf.write(path, v.trace, sc, engine=engine, extra_meta=extra_meta)
    return str(path)


def run(releases: Sequence[Release], scenarios: Sequence[Scenario], props: Sequence[Property],
        out: Optional[pathlib.Path], max_states: int = DEFAULT_MAX_STATES,
        progress=None, write_witnesses: bool = False) -> List[Result]:
    """Explore each (scenario, release) pair once for all properties.

    Counterexamples of violated safety properties are written under ``out``
    (and witnesses of reachability properties when ``write_witnesses``).
    """
    results: List[Result] = []
    for sc in scenarios:
        for rel in releases:
            ex = explore(rel, sc, props, max_states=max_states, keep_graph=False)
            for p in props:
                v = ex.verdicts[p.name]
                path = _write_trace(v, out, rel, sc, write_witnesses)
                results.append(Result(rel.name, sc.name, p.name, p.kind, v.verdict,
                                      v.trace_length, path, ex.states, ex.seconds))
            if progress is not None:
                progress(sc, rel, ex)
    return results


def run_hypothesis(releases: Sequence[Release], scenarios: Sequence[Scenario],
                   props: Sequence[Property], out: Optional[pathlib.Path], profile: str = "ci",
                   progress=None, write_witnesses: bool = False) -> List[Result]:
    """The same table from the Hypothesis engine: a sample, not a proof; a
    `holds` here means no counterexample was found within the profile."""
    from reqmodel.engines.hypothesis import engine as hypo
    results: List[Result] = []
    for sc in scenarios:
        for rel in releases:
            for p in props:
                hv = hypo.check_property(rel, sc, p, profile)
                v = hv.verdict
                path = _write_trace(v, out, rel, sc, write_witnesses, engine="hypothesis",
                                    extra_meta={"profile": profile, "examples": hv.examples, "runs": hv.runs,
                                                "hypothesis_length": hv.shrunk_length})
                results.append(Result(rel.name, sc.name, p.name, p.kind, v.verdict,
                                      v.trace_length, path, None, hv.seconds, "hypothesis",
                                      hv.examples, hv.steps, hv.runs))
            if progress is not None:
                progress(sc, rel, None)
    return results


# Z3's verdicts, in the exhaustive engine's words where they mean the same:
# a reached good state is "holds" (with the path's length) in both
# and a proof is "holds" (an unreachable good state, "violated") in both
Z3_VERDICTS = {"violated": "violated", "reached": "holds", "proved": "holds",
               "unreachable": "violated",
               "holds-to-depth": "holds-to-depth", "unreached-to-depth": "unreached-to-depth"}


def run_z3(releases: Sequence[Release], scenarios: Sequence[Scenario], props: Sequence[Property],
           out: Optional[pathlib.Path], depth: int, max_net: int = 8, progress=None,
           write_witnesses: bool = False, seconds: Optional[float] = None) -> List[Result]:
    """The same table from bounded model checking: a violation is a shortest
    one (depths are tried in order); "holds-to-depth" means none of at most
    ``depth`` steps exists."""
    from reqmodel.engines.z3 import bmc
    from reqmodel.engines.exhaustive import Verdict
    results: List[Result] = []
    for sc in scenarios:
        for rel in releases:
            applicable = [p for p in props if p.applies(rel, sc)]
            res = (bmc.run(rel, sc, applicable, depth, max_net=max_net, seconds=seconds)
                   if applicable else {})
            for p in props:
                r = res.get(p.name)
                if r is None:
                    results.append(Result(rel.name, sc.name, p.name, p.kind, "not-applicable",
                                          None, None, None, 0.0, "z3", depth=depth))
                    continue
                verdict = Z3_VERDICTS[r.verdict]
                v = Verdict(p.name, p.kind, verdict, r.trace)
                path = _write_trace(v, out, rel, sc, write_witnesses, engine="z3",
                                    extra_meta={"depth": depth})
                results.append(Result(rel.name, sc.name, p.name, p.kind, verdict,
                                      v.trace_length, path, None, r.seconds, "z3",
                                      depth=r.depth, clauses=r.clauses, refinements=r.refinements,
                                      proved=r.verdict in ("proved", "unreachable")))
            if progress is not None:
                progress(sc, rel, None)
    return results
