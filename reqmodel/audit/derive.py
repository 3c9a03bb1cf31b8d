"""From a deployment to the model's scenarios ("probes"), each a built-in
scenario's shape with the deployment's settings (notes/audit.md).

The model works on pages, not tokens: its guards compare a prompt with a
worker's intake limit and count free pages, so a real prompt length enters
only through which of admit / cut / reject each role does with it.  A band
of prompt lengths (``deployment.bands``) becomes a long prompt of three pages
next to a valid one-page request (the incident's shape); a role that admits
the long prompt gets a pool and limit of four pages, one that rejects it a
limit of two, one that cuts it a limit of two (or three, when both roles cut
and this one keeps more).  Everything else the deployment decides is copied
onto every probe: auto-truncate and the KV checksum per role, decode's
overlap scheduler, deferred decode KV release (the variable on decode and the
backend's capability), whether the two roles' KV layouts match, and, in
probes of their own, attention-TP ranks, optimistic prefill and the
scheduler's waiting timeout.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import attrs

from reqmodel.audit.deployment import Band, Role
from reqmodel.model import clocks
from reqmodel.model import scenario as sc_mod
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Events, Scenario

DEFERRED = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
WAITING = "SGLANG_REQ_WAITING_TIMEOUT"
PROBE = "SGLANG_ENABLE_FAILED_SESSION_PROBE"

# traffic the audit cannot see in the flags: the client's and the router's
# behaviour.  Each is checked only when the operator says it happens
# (--assume NAME), on these built-in scenarios' shapes.
ASSUMPTIONS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "room-reuse": (("room-reuse", "room-reuse-early"),
                   "clients (or a retrying router) set bootstrap_room themselves and reuse it"),
    "parallel-sampling": (("room-concurrent",),
                          "requests with n > 1 (every sample keeps its prompt's bootstrap_room), "
                          "or two clients' requests on one room"),
    "one-leg-abort": (("abort-reaches-prefill", "abort-reaches-decode"),
                      "a client's abort reaches one worker only (a router that keeps the other "
                      "leg, or /abort_request on one server)"),
    "pause-retract": (("pause-abort-overlap", "pause-abort"),
                      "pause_generation(mode='retract') on decode (RL weight updates)"),
    "multi-prefill": (("inflight-reuse",),
                      "several prefill instances or prefill DP ranks send into one decode "
                      "instance"),
    "prefill-faults": (("prefill-silent", "prefill-dies"),
                       "a prefill instance may die (its process or node lost), or its bootstrap "
                       "server may miss decode's /health probes while it runs on (the second "
                       "probe has two prefill instances)"),
    "worker-faults": (("transfer-worker-dies", "transfer-worker-dies-abort"),
                      "a prefill transfer worker thread may raise out of its loop (prefill logs "
                      "'Transfer thread failed'), its process running on"),
}


def with_sessions(probes: List["Probe"], p: Role, d: Role) -> Tuple[List["Probe"], List[str]]:
    """Each probe's requests are turns of streaming sessions when both roles
    run with ``--enable-streaming-session`` (a session's turns need it open
    on both servers, and each keeps its own in-flight mark); otherwise a
    session's mark is nothing a request owns.  With the flag on one role
    only, a client cannot open the session on the other: noted, not probed."""
    on = p.streaming_sessions and d.streaming_sessions
    notes = []
    if p.streaming_sessions != d.streaming_sessions:
        one = p if p.streaming_sessions else d
        notes.append(f"--enable-streaming-session on {one.name} only: a streaming session "
                     "cannot be opened on the other role, so the probes send no session turns")
    return [attrs.evolve(pr, scenario=attrs.evolve(pr.scenario, sessions=on))
            for pr in probes], notes
# decode's heartbeat (cc 19:1083 ... 23:1998): how long it takes to declare a
# prefill instance lost, read from decode's environment
HEARTBEAT = ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE")


def heartbeat(d: Role) -> str:
    """Decode's heartbeat settings in words: the interval is clamped to at
    least 2 s and the count to at least 1 (cc 19:270-274, 23:479-483)."""
    interval = max(2.0, float(d.env.get(HEARTBEAT[0], 5.0)))
    count = max(1, int(d.env.get(HEARTBEAT[1], 2)))
    return (f"decode declares a prefill instance lost after {count} missed /health "
            f"probe{'s' if count > 1 else ''} {interval:g} s apart, each allowed 3 s "
            f"({HEARTBEAT[1]}, {HEARTBEAT[0]})")


@attrs.frozen
class Probe:
    family: str  # the probe's name in the report
    template: str  # the built-in scenario whose shape it takes (and findings it may show)
    why: str  # why the audit runs it on this deployment, for people
    scenario: Scenario


@attrs.frozen
class Settings:
    """What the deployment decides on every probe."""

    p_auto_truncate: bool
    d_auto_truncate: bool
    p_checksum: bool
    d_checksum: bool
    d_overlap: bool
    deferred_release: bool
    layouts_match: bool
    notes: Tuple[str, ...]
    # prefill's failed-session probe (its Mooncake manager, mc 19:273-285)
    failed_session_probe: bool = False
    # the timeouts the model orders (model.clocks) where the deployment sets
    # them away from their defaults: the transfer engine's on prefill (its
    # batches write decode's pages), the deferral timeout on decode
    timeouts: Tuple[Tuple[str, float], ...] = ()


def settings(rel: Release, p: Role, d: Role) -> Settings:
    notes = []
    if not p.overlap:
        notes.append("prefill runs with --disable-overlap-schedule, which the model does not "
                     "have (a middle chunk is then sent from process_prefill_chunk, pf "
                     "21:1259-1269): the probes run prefill with the overlap loop")
    # deferred decode KV release: the variable on decode, and (0.5.21+) the
    # backend's supports_deferred_decode_kv_release (cc 21:184-187, mc 21:221)
    deferred = bool(d.env.get(DEFERRED, rel.deferred_release_default))
    probe = bool(p.env.get(PROBE, rel.failed_session_probe_default))
    set_here = ((env, float(role.env[env])) for env, role in ((clocks.MC_TRANSFER_TIMEOUT, p),
                                                               (clocks.DEFERRAL_TIMEOUT, d))
                if env in role.env)
    timeouts = tuple(sorted((env, value) for env, value in set_here
                            if value > 0 and value != clocks.default_seconds(rel, env)))
    return Settings(p.auto_truncate, d.auto_truncate, p.kv_checksum, d.kv_checksum, d.overlap,
                    deferred, p.layout == d.layout, tuple(notes), probe, timeouts)


def _apply(sc: Scenario, st: Settings, name: str, truncate: bool = True) -> Scenario:
    """``sc`` with the deployment's settings, validated as a scenario file is
    (and so as a trace's scenario replays).  ``truncate``: copy each role's
    --allow-auto-truncate (a band probe has it from its band already)."""
    pre = attrs.evolve(sc.prefill, kv_checksum=st.p_checksum)
    dec = attrs.evolve(sc.decode, kv_checksum=st.d_checksum, overlap_schedule=st.d_overlap)
    if truncate:
        pre = attrs.evolve(pre, auto_truncate=st.p_auto_truncate)
        dec = attrs.evolve(dec, auto_truncate=st.d_auto_truncate)
    sc = attrs.evolve(sc, name=name, prefill=pre, decode=dec,
                      deferred_release=st.deferred_release, layouts_match=st.layouts_match,
                      failed_session_probe=st.failed_session_probe, timeouts=st.timeouts)
    return sc_mod.from_dict(sc_mod.to_dict(sc), origin=name)


# a band's treatment on one role -> (pool, intake limit, auto-truncate) in pages
def _worker(outcome: Tuple[str, int], cut_rank: int) -> Tuple[int, int, bool]:
    kind = outcome[0]
    if kind == "admit":
        return 4, 4, False
    if kind == "truncate":
        return 4, 1 + cut_rank, True
    return 2, 2, False  # rejected at intake


BAND_TEMPLATES = {  # (prefill, decode) treatment -> the built-in of that shape
    ("reject-intake", "admit"): "incident",
    ("truncate", "admit"): "auto-truncate",
    ("admit", "reject-intake"): "decode-reject",
    ("reject-intake", "reject-intake"): "both-reject",
}


def band_probe(band: Band, st: Settings) -> Optional[Probe]:
    """The probe for one band of prompt lengths, or None when the model has
    nothing to check there (both admit it, or a tokenizer refuses it)."""
    po, do = band.prefill, band.decode
    if po[0] == "admit" and do[0] == "admit":
        return None
    if "reject-tokenizer" in (po[0], do[0]):
        return None
    cuts = sorted({o[1] for o in (po, do) if o[0] == "truncate"})
    p_pool, p_lim, p_cut = _worker(po, cuts.index(po[1]) + 1 if po[0] == "truncate" else 0)
    d_pool, d_lim, d_cut = _worker(do, cuts.index(do[1]) + 1 if do[0] == "truncate" else 0)
    long = max(3, max(p_lim, d_lim) + 1) if "admit" not in (po[0], do[0]) else 3
    p_pool, d_pool = max(p_pool, p_lim), max(d_pool, d_lim)
    if po[0] == "admit":
        p_pool = p_lim = long + 1
    if do[0] == "admit":
        d_pool = d_lim = long + 1
    template = BAND_TEMPLATES.get((po[0], do[0]), "")
    if template == "auto-truncate" and st.p_checksum and st.d_checksum:
        template = "auto-truncate-checksum"
    sc = Scenario(
        name="", prompt_pages=(long, 1),
        prefill=sc_mod.Worker(pool_pages=p_pool, intake_limit_pages=p_lim, auto_truncate=p_cut,
                              metadata_buffers=2),
        decode=sc_mod.Worker(pool_pages=d_pool, intake_limit_pages=d_lim, auto_truncate=d_cut,
                             metadata_buffers=2),
        sessions=True,
        description=f"prompts of {band.lo:,}-{band.hi:,} tokens")
    what = {"admit": "admits", "truncate": "cuts", "reject-intake": "rejects"}
    why = (f"prompts of {band.lo:,} to {band.hi:,} tokens: prefill {what[po[0]]} them, decode "
           f"{what[do[0]]} them; a valid request beside one")
    family = f"band-{band.lo}"
    return Probe(family, template, why, _apply(sc, st, f"audit-{family}", truncate=False))


def _from_builtin(name: str, family: str, why: str, st: Settings,
                  **changes: Any) -> Probe:
    base = sc_mod.builtin(name)
    if changes:
        base = attrs.evolve(base, **changes)
    return Probe(family, name, why, _apply(base, st, f"audit-{family}"))


def traffic_probes(rel: Release, p: Role, d: Role, st: Settings,
                   assume: Tuple[str, ...]) -> Tuple[List[Probe], List[str]]:
    """The probes every deployment of these flags needs, and the notes on
    what they leave out."""
    out = [
        _from_builtin("two-valid", "valid",
                      "two valid requests, nothing fails: every request is served from its own "
                      "pages without a timeout", st),
        _from_builtin("two-valid", "client-abort",
                      "two valid requests sharing one decode page: the first one's client may "
                      "abort (a router closing both legs) and its timeouts may fire while the "
                      "second waits for the page", st,
                      decode=attrs.evolve(sc_mod.builtin("two-valid").decode, pool_pages=1,
                                          intake_limit_pages=1),
                      events=Events(client_abort=(0,), timeouts=(0,))),
        _from_builtin("transfer-failure", "transfer-failure",
                      "a transfer fails while a request's KV is handed off, and another request "
                      "may take its decode pages", st),
        _from_builtin("retract-abort", "retract-abort",
                      "decode retracts a running request under memory pressure while its client "
                      "aborts", st),
        _from_builtin("retract-late-write", "retract-late-write",
                      "decode retracts a running request under memory pressure while another "
                      "request's client aborts with prefill's write to it in flight; the first "
                      "resumes into whichever pages are free", st),
    ]
    notes: List[str] = []
    if d.attn_tp > 1:
        out.append(_from_builtin(
            "rank-admission", "decode-rank-admission",
            f"decode attention TP {d.attn_tp}: each decode rank lets a failed transfer's hold "
            "go on its own and admits the next request from its own pool", st))
    if d.attn_tp > p.attn_tp:
        out.append(_from_builtin(
            "two-rank-abort", "decode-ranks",
            f"decode attention TP {d.attn_tp} over prefill's {p.attn_tp}: each decode rank "
            "sends its own ABORT and waits for its own drain ack", st))
    elif p.attn_tp > d.attn_tp:
        out.append(_from_builtin(
            "prefill-tp-failure", "prefill-ranks",
            f"prefill attention TP {p.attn_tp} over decode's {d.attn_tp}: decode counts a "
            "report from each prefill rank, one of which fails", st))
    elif p.attn_tp > 1:
        notes.append(f"attention TP {p.attn_tp} on both roles pairs each decode rank with one "
                     "prefill rank; the probes model one pair")
    waiting = {r.name: r.env.get(WAITING, -1) for r in (p, d)}
    if any(v is not None and v > 0 for v in waiting.values()):
        out.append(_from_builtin(
            "req-waiting-timeout", "waiting-timeout",
            "SGLANG_REQ_WAITING_TIMEOUT is set (" + ", ".join(
                f"{k} {v:g} s" for k, v in waiting.items() if v and v > 0) + "): a scheduler "
            "aborts a request that waited too long, on its own worker", st))
    if p.optimistic_attempts > 0:
        attempts = min(p.optimistic_attempts, 2)
        for name in ("optimistic-tight", "optimistic-abort"):
            out.append(_from_builtin(
                name, name.replace("optimistic", "optimistic-prefill"),
                f"--optimistic-prefill-attempts {p.optimistic_attempts}: prefill may run a "
                "request before decode has its pages", st, optimistic_prefill_attempts=attempts))
        if p.optimistic_attempts > 2:
            notes.append(f"--optimistic-prefill-attempts {p.optimistic_attempts} is modelled "
                         "as 2 attempts")
    for name in assume:
        templates, what = ASSUMPTIONS[name]
        if name == "pause-retract":
            templates = templates[:1] if d.overlap else templates[1:]
        if name == "prefill-faults":
            what = f"{what}; {heartbeat(d)}"
        for t in templates:
            out.append(_from_builtin(t, f"{name}-{t}", f"assumed: {what}", st))
    return out, notes
