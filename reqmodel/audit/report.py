"""The audit for people: a terminal summary and a Markdown report to attach
to a change ticket (each finding's trace as a Mermaid sequence diagram)."""
from __future__ import annotations

from typing import List

from reqmodel.audit.deployment import describe
from reqmodel.audit.gates import Audit, Finding

MARK = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail"}
GATE_TEXT = {
    "pool-context": "the declared context limit matches what each worker's KV pool can hold, "
                    "and both roles treat every prompt length alike",
    "admission": "a rejected request ends at the door; valid, re-entering and preempted "
                 "requests, and requests that still own KV or metadata, are kept",
    "transfer-read": "what decode reads is what its own transfer wrote (HTTP 200 and "
                     "transfer-complete prove neither); a checksum counts only where it is on, "
                     "supported and verified",
    "lifetime": "pages are freed or reused only after in-flight writes end, deferred release is "
                "on for both roles, nothing is held until a timeout, no scheduler dies, and "
                "each answer names what ended the request, and a request's end frees its "
                "streaming session for the next turn",
}


def mermaid(trace_file: str) -> str:
    """The trace's Mermaid sequence diagram (what ``reqmodel show --format
    mermaid`` prints)."""
    from reqmodel.traces import render
    from reqmodel.traces import replay as rp
    loaded = rp.load(trace_file)
    out = rp.run(loaded)
    return render.to_mermaid(loaded.meta, loaded.steps, out.states, out.events,
                             rp.violating_last(loaded, out))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(a: Audit, command: str) -> str:
    p, d = a.prefill, a.decode
    out: List[str] = [f"# PD deployment audit: SGLang {a.release}", ""]
    out += ["```sh", command, "```", ""]
    out += ["| gate | verdict | what it asks |", "|---|---|---|"]
    out += [f"| {g.gate} | {MARK[g.verdict]} | {GATE_TEXT[g.gate]} |" for g in a.gates]
    out += ["", "## The deployment as read", "",
            "| | prefill | decode |", "|---|---|---|"]
    rows = [("context length", lambda r: f"{r.context_len:,} ({r.context_source})"),
            ("KV pool (tokens)", lambda r: f"{r.kv_tokens:,} ({r.kv_source})"),
            ("intake limit (max_req_input_len)", lambda r: f"{r.intake_limit:,}"),
            ("--allow-auto-truncate", lambda r: str(r.auto_truncate).lower()),
            ("KV checksum", lambda r: str(r.kv_checksum).lower()),
            ("transfer backend", lambda r: r.backend),
            ("attention TP", lambda r: str(r.attn_tp)),
            ("overlap scheduler", lambda r: str(r.overlap).lower())]
    out += [f"| {name} | {_cell(f(p))} | {_cell(f(d))} |" for name, f in rows]
    out += ["", "Prompt lengths, as each role treats them:", "",
            "| prompt tokens | prefill | decode | |", "|---|---|---|---|"]
    for b in a.bands:
        hi = "and longer" if b.hi >= max(p.context_len, d.context_len) else f"{b.hi:,}"
        out.append(f"| {b.lo:,} – {hi} | {describe(b.prefill)} | {describe(b.decode)} | "
                   f"{'**roles differ**' if b.mismatch else ''} |")
    if a.probes:
        out += ["", "Scenarios the model checked (every property, every interleaving):", ""]
        out += [f"- `{pr.scenario.name}` (the shape of `{pr.template or 'its own'}`): {pr.why}"
                for pr in a.probes]
    for g in a.gates:
        out += ["", f"## {g.gate}: {MARK[g.verdict]}", "", GATE_TEXT[g.gate] + ".", ""]
        shown = [f for f in g.findings if f.verdict != "pass" or f.why]
        if not shown:
            out += [f"Nothing found: {', '.join(f'`{c}`' for c in g.checked)} hold on every "
                    "scenario above.", ""]
        for f in shown:
            out += _finding(f)
    out += ["", "## What this audit cannot see", ""]
    out += [f"- {n}" for n in a.notes + a.blind]
    out += ["", "Each trace replays with `reqmodel replay TRACE`, reads step by step with "
            "`reqmodel show TRACE`, and runs on the wheel with `reqmodel conform --trace TRACE`.",
            ""]
    return "\n".join(out)


def _finding(f: Finding) -> List[str]:
    out = [f"### {MARK[f.verdict]} `{f.check}`" + (f" ({f.finding_id})" if f.finding_id else ""),
           "", f.why, ""]
    if f.fix:
        out += [f"**What to change:** {f.fix}", ""]
    if f.trace_file:
        out += [f"Shortest trace: `{f.trace_file}` ({f.trace_length} steps, scenario "
                f"`{f.scenario}`)" + (f"; also on {', '.join(f'`{s}`' for s in f.also)}"
                                      if f.also else "") + ".", "",
                "```mermaid", mermaid(f.trace_file).rstrip("\n"), "```", ""]
    return out
