"""The write-up's four acceptance gates for one deployment on one release.

``pool-context`` is arithmetic on the release's own limits
(``deployment.bands``).  ``admission``, ``transfer-read`` and ``lifetime``
are the model's properties (each names its gate, ``Property.gate``) checked
exhaustively on the probes ``derive`` builds from the deployment; a
violation is a finding with its shortest trace, matched to a recorded
finding (``reqmodel/findings.toml``) when the probe has that finding's shape.
"""
from __future__ import annotations

import pathlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import attrs

from reqmodel import findings as recorded
from reqmodel.audit import derive
from reqmodel.audit.deployment import (INTAKE_CITES, MODELLED_BACKENDS, Band, Role, bands,
                                       describe)
from reqmodel.engines.base import Answer, Exhaustive, run
from reqmodel.engines.exhaustive import DEFAULT_MAX_STATES
from reqmodel.model import properties as props_mod
from reqmodel.model import scenario as sc_mod
from reqmodel.model.actions.core import BY_NAME
from reqmodel.model.releases import Release

GATES = ("pool-context", "admission", "transfer-read", "lifetime")
VERDICTS = ("pass", "warn", "fail")

# what the audit cannot see, said in every report
BLIND = (
    "the router: whether it closes both legs when the client goes or one leg fails, and whether "
    "it draws a fresh bootstrap_room per request (--assume one-leg-abort, room-reuse, "
    "parallel-sampling check what follows when it does not)",
    "client-supplied bootstrap rooms and n > 1 sampling (--assume room-reuse, "
    "parallel-sampling)",
    "the model's architecture: a hybrid Mamba or SWA model has other pools and checksum inputs; "
    "the probes model plain KV",
    "traffic over time: the model decides what can happen in some order, not how often; "
    "timeouts are events that may fire, not durations",
)


@attrs.frozen
class Finding:
    gate: str
    check: str  # a property's name, or one of the audit's own checks
    verdict: str  # fail | warn | pass
    why: str
    fix: str
    scenario: Optional[str] = None  # the probe's scenario name
    trace_file: Optional[str] = None
    trace_length: Optional[int] = None
    also: Tuple[str, ...] = ()  # other probes where it fails the same way
    finding_id: Optional[str] = None  # the recorded finding it shows
    title: str = ""  # one line for a table (the recorded finding's title, or the property's)

    def as_json(self) -> dict:
        out = {"property": self.check, "verdict": self.verdict, "scenario": self.scenario,
               "trace_file": self.trace_file, "title": self.title or self.why, "why": self.why,
               "fix": self.fix}
        if self.trace_length is not None:
            out["trace_length"] = self.trace_length
        if self.also:
            out["also"] = list(self.also)
        if self.finding_id:
            out["finding"] = self.finding_id
        return out


@attrs.frozen
class Gate:
    gate: str
    findings: Tuple[Finding, ...]
    checked: Tuple[str, ...]  # what the gate ran (properties, the audit's own checks)

    @property
    def verdict(self) -> str:
        return max((f.verdict for f in self.findings), key=VERDICTS.index, default="pass")

    def as_json(self) -> dict:
        return {"gate": self.gate, "verdict": self.verdict, "checked": list(self.checked),
                "findings": [f.as_json() for f in self.findings]}


@attrs.frozen
class Audit:
    release: str
    prefill: Role
    decode: Role
    bands: Tuple[Band, ...]
    probes: Tuple[derive.Probe, ...]
    gates: Tuple[Gate, ...]
    notes: Tuple[str, ...]  # what the probes leave out for this deployment
    blind: Tuple[str, ...]

    def as_json(self) -> dict:
        def role(r: Role) -> dict:
            return {"context_len": r.context_len, "context_from": r.context_source,
                    "kv_tokens": r.kv_tokens, "kv_tokens_from": r.kv_source,
                    "intake_limit": r.intake_limit, "auto_truncate": r.auto_truncate,
                    "kv_checksum": r.kv_checksum, "backend": r.backend,
                    "attention_tp": r.attn_tp, "overlap_schedule": r.overlap,
                    "streaming_sessions": r.streaming_sessions}
        return {
            "release": self.release,
            "roles": {"prefill": role(self.prefill), "decode": role(self.decode)},
            "prompt_lengths": [{"from": b.lo, "to": b.hi, "prefill": describe(b.prefill),
                                "decode": describe(b.decode), "roles_differ": b.mismatch}
                               for b in self.bands],
            "probes": [{"name": p.scenario.name, "shape_of": p.template, "why": p.why,
                        "settings": sc_mod.settings_summary(p.scenario)}
                       for p in self.probes],
            "gates": [g.as_json() for g in self.gates],
            "not_modelled": list(self.notes), "cannot_see": list(self.blind),
        }


def _tokens(n: int) -> str:
    return f"{n:,}"


def pool_context(release: str, p: Role, d: Role, bs: Sequence[Band]) -> Gate:
    """Gate 1: each role's intake limit against the declared context, and
    prompt lengths the two roles treat differently."""
    out: List[Finding] = []
    smallest = min(p.kv_tokens, d.kv_tokens)
    same = (f"give both roles the same --context-length, at most {_tokens(smallest)} (the "
            "smaller KV pool): both intake limits are then context - 6 and every prompt is "
            "treated alike")
    for b in bs:
        if not b.mismatch:
            continue
        hi = "and longer" if b.hi >= max(p.context_len, d.context_len) else f"to {_tokens(b.hi)}"
        out.append(Finding(
            "pool-context", "roles-agree-on-prompts", "fail",
            f"prompts of {_tokens(b.lo)} {hi} tokens: prefill {describe(b.prefill)}, decode "
            f"{describe(b.decode)}; a request the two legs treat differently is the incident's "
            "start (the model's gates below run such a prompt)", same,
            scenario=f"audit-band-{b.lo}",
            title=f"prompts of {_tokens(b.lo)} {hi} tokens: prefill {describe(b.prefill)}, "
                  f"decode {describe(b.decode)}"))
    for r in (p, d):
        if r.kv_tokens < r.context_len:
            out.append(Finding(
                "pool-context", "context-fits-pool", "warn",
                f"{r.name}: the declared context is {_tokens(r.context_len)} tokens "
                f"({r.context_source}) but the KV pool holds {_tokens(r.kv_tokens)} "
                f"({r.kv_source}): prompts of {_tokens(r.intake_limit)} tokens or more are "
                f"{'cut' if r.auto_truncate else 'rejected'} at intake "
                f"(max_req_input_len, {INTAKE_CITES[release]}), not served to the declared context",
                f"declare --context-length {_tokens(r.kv_tokens)} or less on {r.name}, or give "
                "it a larger pool (--mem-fraction-static, a GPU with more memory)"))
    if p.context_len != d.context_len:
        out.append(Finding(
            "pool-context", "same-context", "warn",
            f"the roles declare different contexts: prefill {_tokens(p.context_len)}, decode "
            f"{_tokens(d.context_len)}", same))
    for note in p.unread() + d.unread():
        out.append(Finding("pool-context", "limits-read", "warn", note,
                           "check the limit in the worker's log ('Input length ... exceeds the "
                           "maximum allowed length') against a prompt of the band's length"))
    checked = ("roles-agree-on-prompts", "context-fits-pool", "same-context", "limits-read")
    return Gate("pool-context", tuple(out), checked)


def _recorded(prop: str, template: str, rel: str) -> Optional[recorded.Finding]:
    f = recorded.lookup(prop, template)
    if f is None or (f.releases and rel not in f.releases):
        return None
    return f


def _unmet(f: recorded.Finding, p: Role, d: Role) -> List[str]:
    """The settings a recorded finding needs that this deployment lacks."""
    missing = []
    for need in f.requires_env:
        where, _, rest = need.partition(":")
        name, _, want = rest.partition("=")
        role = p if where == "prefill" else d
        value = role.env.get(name)
        if str(value).lower() != want.lower():
            missing.append(f"{name}={want} on {where} (here {value})")
    return missing


def _timeouts(r) -> Tuple[str, ...]:
    """The timeouts a trace needs to fire (their environment variables)."""
    if r.trace is None:
        return ()
    names = (BY_NAME[st.action].timeout for st in r.trace.steps)
    return tuple(dict.fromkeys(n for n in names if n))


def _without_timeouts(rel: Release, probe: derive.Probe, prop, out, workers):
    """The property on the probe with its timeouts switched off: a violation
    there needs no timeout to fire."""
    ev = attrs.evolve(probe.scenario.events, timeouts=())
    sc = attrs.evolve(probe.scenario, events=ev, name=probe.scenario.name + "-no-timeouts")
    checker = Exhaustive(max_states=DEFAULT_MAX_STATES, workers=workers or 1)
    return run(checker, [rel], [sc], (prop,), out)[0]


def model_gates(rel: Release, p: Role, d: Role, probes: Sequence[derive.Probe],
                out: Optional[pathlib.Path], workers: Optional[int] = None,
                progress: Optional[Callable] = None
                ) -> Tuple[List[Gate], Dict[Tuple[str, str], object]]:
    """The three model gates, and every violation by (probe, property)."""
    props = tuple(props_mod.CATALOG.values())
    checker = Exhaustive(max_states=DEFAULT_MAX_STATES, workers=workers or 1)
    results = run(checker, [rel], [pr.scenario for pr in probes], props, out, progress=progress)
    by_name = {pr.scenario.name: pr for pr in probes}
    gates = []
    for gate in GATES[1:]:
        found: List[Finding] = []
        gate_props = [q for q in props if q.gate == gate]
        for q in gate_props:
            bad = sorted((r for r in results if r.property == q.name
                          and r.verdict == Answer.VIOLATED),
                         key=lambda r: (r.trace_length or 0, r.scenario))
            # one finding per recorded finding the probes show, else one per property
            groups: Dict[Optional[str], list] = {}
            for r in bad:
                f = _recorded(q.name, by_name[r.scenario].template, rel.name)
                groups.setdefault(f.id if f else None, []).append((r, f))
            for key, items in groups.items():
                found.append(_finding(rel, p, d, q, items, by_name, out, workers))
        found.sort(key=lambda f: (-VERDICTS.index(f.verdict), f.check))
        gates.append(Gate(gate, tuple(found), tuple(q.name for q in gate_props)))
    violations = {(r.scenario, r.property): r for r in results if r.verdict == Answer.VIOLATED}
    return gates, violations


def _finding(rel, p, d, q, items, by_name, out, workers) -> Finding:
    r, f = items[0]
    probe = by_name[r.scenario]
    verdict = q.on_violation
    also = tuple(x.scenario for x, _ in items[1:])
    if f is not None:
        why = f"{f.title} ({f.severity}, {f.status}). {f.summary}"
        fix = f.fix
        unmet = _unmet(f, p, d)
        if unmet and verdict == "fail":
            verdict = "warn"
            why += (" On the real code this path needs " + "; ".join(unmet) +
                    ": here it opens only as the finding's configuration says.")
    else:
        what = "unreachable" if q.kind.value == "sometimes" else "violated"
        why = f"{q.text} ({what} on the probe: {probe.why})"
        fix = ("no recorded finding: read the trace (reqmodel show TRACE) and run it on the "
               "wheel (reqmodel conform --trace TRACE) before reporting it")
    needs = _timeouts(r)
    if verdict == "fail" and needs and q.kind.value == "always":
        again = _without_timeouts(rel, probe, q, out, workers)
        if again.verdict == Answer.VIOLATED:
            r = again
        else:
            verdict = "warn"
            limits = ", ".join(f"{n} ({_env_value(n, p, d, rel):g} s here)" for n in needs)
            why += (f" Every violation needs a timeout to fire first: {limits}; it happens "
                    "only when a transfer or a peer outlives it.")
            fix = (f"keep {', '.join(needs)} above the longest transfer of one prompt's KV; "
                   + fix)
    if r.timing:  # what engines.base.run read off the trace
        why += " The trace " + "; ".join(str(n) for n in r.timing) + "."
    title = f.title if f is not None else q.text.split(". ")[0].rstrip(".")
    if needs and verdict == "warn" and q.on_violation == "fail":
        title += f" (after {', '.join(needs)})"
    return Finding(q.gate, q.name, verdict, why, fix, r.scenario, r.trace_file, r.trace_length,
                   also, f.id if f else None, title)


def _env_value(name: str, p: Role, d: Role, rel: Release) -> float:
    for role in (d, p):
        if role.env.get(name) is not None:
            return float(role.env[name])
    return float(rel.timeout_seconds(name))


def checksum_finding(rel: Release, p: Role, d: Role) -> Optional[Finding]:
    """Whether the KV checksum protects the read: on, on both roles, computed
    by this backend, over layouts that digest alike (transfer-read)."""
    if not (p.kv_checksum or d.kv_checksum):
        return None
    fix = "turn --disaggregation-enable-kv-checksum on for both roles, with the same KV layout"
    if p.kv_checksum != d.kv_checksum:
        on, off = (p, d) if p.kv_checksum else (d, p)
        return Finding("transfer-read", "checksum-protects", "warn",
                       f"the KV checksum is on for {on.name} only: decode verifies only a digest "
                       "prefill wrote (expected 0 is skipped, dc 21:3049-3054), so it protects "
                       "nothing", fix)
    if p.layout != d.layout:
        names = ("attention TP", "PP stages", "page size", "KV dtype")
        differ = [f"{n} {a} / {b}" for n, a, b in zip(names, p.layout, d.layout) if a != b]
        what = ("and fails every good transfer as corrupted" if rel.checksum is not None
                and not rel.checksum.needs_matching_layouts else
                "and skips the comparison (the layout signature differs, dc 23:2580-2598): it "
                "protects nothing")
        mla = (" For an MLA model the latent KV is the same on every TP rank, so a TP width "
               "alone does not change the layout; the audit cannot see the model and assumes "
               "it does." if len(differ) == 1 and differ[0].startswith("attention TP") else "")
        return Finding("transfer-read", "checksum-protects", "warn",
                       "the KV checksum is on for both roles, but their KV layouts differ "
                       f"(prefill / decode: {', '.join(differ)}); each side digests its own "
                       f"buffers {what}.{mla}", fix)
    return Finding("transfer-read", "checksum-protects", "pass",
                   "the KV checksum is on for both roles over matching layouts: decode aborts a "
                   "request whose pages differ from what prefill digested (a 500, not another "
                   "request's KV)", "")


def audit(rel: Release, p: Role, d: Role, assume: Tuple[str, ...],
          out: Optional[pathlib.Path], workers: Optional[int] = None,
          progress: Optional[Callable] = None) -> Audit:
    bs = bands(p, d)
    gate1 = pool_context(rel.name, p, d, bs)
    notes: List[str] = []
    backends = {p.backend, d.backend}
    if len(backends) > 1:
        gates = [Gate(g, (Finding(g, "same-backend", "fail",
                                  f"prefill uses {p.backend}, decode {d.backend}: the roles "
                                  "cannot hand KV over", "use one --disaggregation-transfer-"
                                  "backend on both roles"),), ("same-backend",))
                 for g in GATES[1:]]
        return Audit(rel.name, p, d, tuple(bs), (), (gate1, *gates), (), BLIND)
    backend = backends.pop()
    if backend not in MODELLED_BACKENDS:
        gates = [Gate(g, (Finding(g, "backend-modelled", "warn",
                                  f"the {backend} backend is not modelled (the model follows "
                                  "Mooncake's manager and the common connection code): this "
                                  "gate is not checked", "audit a Mooncake deployment, or read "
                                  "the backend's code against notes/traceability.md"),),
                      ("backend-modelled",)) for g in GATES[1:]]
        return Audit(rel.name, p, d, tuple(bs), (), (gate1, *gates), (), BLIND)
    st = derive.settings(rel, p, d)
    notes.extend(st.notes)
    probes: List[derive.Probe] = []
    for b in bs:
        pr = derive.band_probe(b, st)
        if pr is not None and all(pr.scenario != x.scenario for x in probes):
            probes.append(pr)
        elif "reject-tokenizer" in (b.prefill[0], b.decode[0]) and b.mismatch:
            notes.append(f"prompts of {_tokens(b.lo)} tokens and more: one leg's tokenizer "
                         "refuses them before its scheduler sees them, which the model does not "
                         "have; the other leg waits for its bootstrap or waiting timeout")
    traffic, tnotes = derive.traffic_probes(rel, p, d, st, assume)
    probes, snotes = derive.with_sessions(probes + traffic, p, d)
    notes.extend(tnotes + snotes)
    model, violations = model_gates(rel, p, d, probes, out, workers, progress)
    extra = {"transfer-read": [checksum_finding(rel, p, d)], "lifetime": [
        _deferred_finding(rel, p, d, st)]}
    gates = []
    for g in model:
        more = tuple(f for f in extra.get(g.gate, []) if f is not None)
        fs = tuple(sorted(g.findings + more, key=lambda f: -VERDICTS.index(f.verdict)))
        gates.append(attrs.evolve(g, findings=fs, checked=g.checked + tuple(f.check for f in more)))
    gate1 = attrs.evolve(gate1, findings=tuple(_band_trace(f, violations)
                                               for f in gate1.findings))
    return Audit(rel.name, p, d, tuple(bs), tuple(probes), (gate1, *gates), tuple(notes), BLIND)


def _band_trace(f: Finding, violations: Dict[Tuple[str, str], object]) -> Finding:
    """A band the roles treat differently links the shortest trace of the
    worst property the model violates on that band's probe: what the
    mismatch leads to."""
    if f.scenario is None:
        return f
    on = [(props_mod.CATALOG[prop], r) for (sc, prop), r in violations.items()
          if sc == f.scenario and r.trace_file]
    if not on:
        return attrs.evolve(f, scenario=None)
    # the worst first: a failing property before a warning one, another
    # request's KV read before a door or a lifetime defect, then the shortest
    order = ("transfer-read", "admission", "lifetime")
    q, r = min(on, key=lambda x: (x[0].on_violation != "fail", order.index(x[0].gate),
                                  x[1].trace_length or 0))
    return attrs.evolve(f, trace_file=r.trace_file, trace_length=r.trace_length,
                        why=f.why + f"; on this band the model finds {q.name} violated "
                        f"({r.trace_length} steps)")


def _deferred_finding(rel: Release, p: Role, d: Role, st) -> Optional[Finding]:
    """Deferred decode KV release on both roles: decode holds an aborted
    request's pages until prefill's drain ack (cc 21:184-187 reads the
    variable on both sides)."""
    pv, dv = (bool(r.env.get(derive.DEFERRED)) for r in (p, d))
    if pv == dv:
        if dv:
            return None
        return Finding("lifetime", "deferred-release-on", "warn",
                       "deferred decode KV release is off on both roles "
                       f"({derive.DEFERRED}): decode frees an aborted request's pages while "
                       "prefill's write into them may still be in flight (the probes run it so)",
                       f"set {derive.DEFERRED}=1 on both roles")
    return Finding("lifetime", "deferred-release-on", "warn",
                   f"{derive.DEFERRED} is {'on' if dv else 'off'} on decode but "
                   f"{'on' if pv else 'off'} on prefill: "
                   + ("decode holds pages for drain acks that prefill does not send, until the "
                      "deferral timeout" if dv else "prefill acks drains that decode does not "
                      "wait for: the pages are freed at once"),
                   f"set {derive.DEFERRED} the same on both roles (1)")
