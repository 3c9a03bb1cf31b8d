"""Render a trace for people: a step table, Markdown, a Mermaid sequence
diagram, or DOT.

Everything is derived from the replayed states and the steps' events: what a
step changed is the difference between two consecutive states, written with
SGLang's names (``r0.P`` is request 0's prefill ``Req``, ``r0.D`` its decode
``Req``, ``room 1`` its ``bootstrap_room``).
"""
from __future__ import annotations

import enum
from typing import Any, List, Optional, Sequence, Tuple

import attrs

from reqmodel.model import events as ev
from reqmodel.model import processes
from reqmodel.model.actions import ACTIONS, BY_NAME, Event, Step
from reqmodel.model.properties import CATALOG, WAITS, Kind
from reqmodel.model.state import Finish, KVPoll, Msg, State

LANES = {"client": "Client", "prefill": "Prefill", "transfer": "Transfer", "decode": "Decode"}
LANE_IDS = {"client": "C", "prefill": "P", "transfer": "X", "decode": "D"}


def fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, Finish):
        return str(v)
    if isinstance(v, KVPoll):
        return v.name
    if isinstance(v, enum.Enum):
        return v.name.lower()
    if isinstance(v, tuple):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


def _field_changes(prefix: str, old, new, skip=()) -> List[str]:
    out = []
    for f in attrs.fields(type(old)):
        if f.name in skip:
            continue
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            show = _rid if f.name in ("owner", "writer") else fmt
            out.append(f"{prefix}.{f.name} {show(a)}→{show(b)}")
    return out


def _rank_of(m: Msg, pranks: int = 1) -> str:
    out = f" decode rank {m.rank}" if m.rank else ""
    if m.prank or pranks > 1:
        out += f" prefill rank {m.prank}"
    return out


def _gen(m: Msg) -> str:
    return f" generation {m.gen}" if m.gen else ""


def _msg(m: Msg, pranks: int = 1) -> str:
    """One message; ``pranks`` > 1 names the prefill rank on every message."""
    def _prank(m: Msg) -> str:
        return f" (prefill rank {m.prank})" if m.prank or pranks > 1 else ""

    if m.kind == "metadata":
        return f"send_metadata(r{m.rid}, pages {fmt(m.pages)}, slot {m.slot}){_rank_of(m, pranks)}"
    if m.kind == "abort":
        return f"ABORT r{m.rid} from{_rank_of(m, pranks) or ' decode rank 0'}{_gen(m)}"
    if m.kind == "ack":
        return f"ABORT_ACK r{m.rid} to{_rank_of(m, pranks) or ' decode rank 0'}{_gen(m)}"
    if m.kind == "chunk":
        a, b = m.pages
        return f"chunk r{m.rid} [{a}, {b}){' last' if m.last else ''}{_prank(m)}"
    if m.kind == "write":
        return (f"write r{m.rid}{_prank(m)} in flight to D pages {fmt(m.pages)}"
                f"{' + aux slot ' + str(m.slot) if m.last else ''}")
    if m.kind == "stray":
        return (f"stray write r{m.rid}{_prank(m)} (its batch failed) still landing in D pages "
                f"{fmt(m.pages)}")
    if m.kind == "status":
        return f"status r{m.rid} {fmt(m.poll)}{_prank(m)}"
    if m.kind == "recompute":
        return f"prefill recompute r{m.rid}"
    return f"{m.kind.upper()} r{m.rid}"


def net_changes(old: State, new: State) -> Tuple[List[Msg], List[Msg]]:
    rest = list(old.net)
    added = []
    for m in new.net:
        if m in rest:
            rest.remove(m)
        else:
            added.append(m)
    return added, rest


def changes(old: State, new: State) -> List[str]:
    """What one step changed, one short phrase per change."""
    out: List[str] = []
    for r, (a, b) in enumerate(zip(old.p, new.p)):
        out += _field_changes(f"r{r}.P", a, b)
    for r, (a, b) in enumerate(zip(old.d, new.d)):
        out += _field_changes(f"r{r}.D", a, b)
    ranks = new.prefill_ranks
    for i, (a, b) in enumerate(zip(old.rooms, new.rooms)):
        name = f"room{i // ranks + 1}" + (f"@P{i % ranks}" if ranks > 1 else "")
        out += _field_changes(name, a, b)
    for r, (a, b) in enumerate(zip(old.d_rooms, new.d_rooms)):
        out += _field_changes(f"room{r + 1}.D", a, b)
    for i, (a, b) in enumerate(zip(old.d_pages, new.d_pages)):
        if a != b:
            parts = []
            if a.owner != b.owner:
                parts.append(f"owner {_rid(a.owner)}→{_rid(b.owner)}")
            for q, (wa, wb) in enumerate(zip(a.writers, b.writers)):
                if wa != wb:
                    where = f" of prefill rank {q}'s slice" if len(a.writers) > 1 else ""
                    parts.append(f"last writer{where} {_rid(wa)}→{_rid(wb)}")
            out.append(f"D page {i}: " + ", ".join(parts))
    for i, (a, b) in enumerate(zip(old.d_slots, new.d_slots)):
        if a != b:
            out += _field_changes(f"D slot {i}", a, b)
    for key in sorted(set(old.failed_sessions) ^ set(new.failed_sessions)):
        what = ("lists {} as failed" if key in new.failed_sessions
                else "takes {} off its failed list")
        out.append(f"{_session(key)}: " + what.format(f"decode rank {key[2]}'s session"))
    for inst in sorted(set(new.prefill_dead) - set(old.prefill_dead)):
        out.append(("P" if inst < 0 else f"r{inst}'s prefill instance")
                   + " is dead: none of its processes takes another step")
    for inst, q in sorted(set(new.workers_dead) - set(old.workers_dead)):
        where = "P" if inst < 0 else f"r{inst}'s prefill instance"
        out.append(f"{where} rank {q}'s transfer worker thread has ended: its queue is never "
                   "read again")
    for inst in sorted(set(new.prefill_lost) ^ set(old.prefill_lost)):
        who = "P" if inst < 0 else f"r{inst}'s prefill instance"
        out.append(f"decode drops its registration of {who}" if inst in new.prefill_lost
                   else f"decode registers {who} again")
    added, removed = net_changes(old, new)
    out += [f"+ {_msg(m, ranks)}" for m in added]
    out += [f"− {_msg(m, ranks)}" for m in removed]
    return out


def _session(key: Tuple[int, int, int]) -> str:
    """Whose failed-session list a ``State.failed_sessions`` key is on."""
    inst, q, _ = key
    where = "P" if inst < 0 else f"r{inst}'s prefill instance"
    return f"{where} rank {q}"


def _rid(x: Optional[int]) -> str:
    return "—" if x is None else f"r{x}"


def _event_in_state(e: Event, s: State) -> str:
    """An event, with who last wrote each foreign page when it is a read."""
    if isinstance(e, ev.Read) and e.foreign:
        who = ", ".join(f"page {p} last written by "
                        + "/".join(_rid(w) for w in s.d_pages[p].writers) for p in e.foreign_pages)
        return f"attention reads FOREIGN KV ({who})"
    return e.describe()


@attrs.frozen
class Row:
    index: int
    actor: str
    action: str
    events: Tuple[str, ...]
    changed: Tuple[str, ...]
    violating: bool
    process: str = ""  # the loop or thread whose step it is (model.processes)


def rows(steps: Sequence[Step], states: Sequence[State], events, violating_last: bool) -> List[Row]:
    out = []
    for i, step in enumerate(steps):
        out.append(Row(i + 1, BY_NAME[step.action].actor, str(step),
                       tuple(_event_in_state(e, states[i]) for e in events[i]),
                       tuple(changes(states[i], states[i + 1])),
                       violating_last and i == len(steps) - 1,
                       processes.process_of(step.action)))
    return out


def header(meta: dict, rs: Sequence[Row] = ()) -> List[str]:
    p = CATALOG.get(meta.get("property", ""))
    lines = [f"property: {meta.get('property')}" + (f" — {p.text}" if p else ""),
             f"release: {meta.get('release')}   scenario: {meta.get('scenario')}   "
             f"engine: {meta.get('engine')}   kind: {meta.get('kind', 'counterexample')}"]
    desc = (meta.get("scenario_config") or {}).get("description")
    if desc:
        lines.append("scenario: " + " ".join(desc.split()))
    lines += liveness_lines(meta, rs)
    return lines


def ends_text(meta: dict) -> str:
    """What ends a stuck request's wait, from the trace's ``ends_by``."""
    ends = meta.get("ends_by") or []
    if not ends:
        return "no timeout of the model applies: it waits until the client gives up"
    first = min(e["seconds"] for e in ends)
    parts = [f"{e['env']} ({e['seconds']:g} s by default: {e['action']} on r{e['request']})"
             for e in ends]
    return f"only a timeout ends it, the first after {first:g} s: " + "; ".join(parts)


def liveness_lines(meta: dict, rs: Sequence[Row] = ()) -> List[str]:
    """For a liveness trace: who waits, and what ends the wait or repeats
    (for a lasso, the processes whose steps repeat, when the rows are given)."""
    rid = meta.get("request")
    if rid is None:
        return []
    if meta.get("loop") is not None:
        cycling = list(dict.fromkeys(r.process for r in rs[meta["loop"]:] if r.process))
        who = f" (steps of {', '.join(cycling)})" if cycling else ""
        return [f"lasso: the steps after state {meta['loop']} return to it and repeat "
                f"forever{who}; r{rid}'s client waits on every turn"]
    prop = CATALOG.get(meta.get("property", ""))
    if prop is not None and prop.kind is Kind.BOUNDED:
        at = meta.get("waits_at") or {}
        where = (f" (prefill {at['prefill']}, decode {at['decode']})"
                 if {"prefill", "decode"} <= set(at) else "")
        armed = "; ".join(f"{a.timeout} only {a.armed}" for a in ACTIONS if a.timeout)
        return [f"r{rid} {prop.stuck}{where} from the last state on: nothing the deployment "
                f"does on its own ends the wait, and no timeout is armed ({armed})"]
    if prop is not None and prop.stuck != WAITS:
        ends = ends_text(meta) if meta.get("ends_by") else "no timeout of the model applies: for good"
        return [f"r{rid} {prop.stuck} from the last state on: nothing the deployment does on its "
                f"own ends it; {ends}"]
    return [f"r{rid}'s client waits from the last state on: nothing the deployment does on its "
            f"own answers it; {ends_text(meta)}"]


def markdown_table(meta: dict, rs: Sequence[Row]) -> List[str]:
    """The steps as the lines of a Markdown table (the violating step and a
    lasso's first step marked)."""
    out = ["| # | actor | action | what happened | state changed |", "|---:|---|---|---|---|"]
    loop = meta.get("loop")
    for r in rs:
        mark = " **⚠ violation**" if r.violating else ""
        if loop is not None and r.index == loop + 1:
            mark += " **↻ loop starts**"
        ev = "<br>".join(r.events) or "—"
        ch = "<br>".join(f"`{c}`" for c in r.changed) or "—"
        out.append(f"| {r.index} | {r.actor} | `{r.action}`{mark} | {ev} | {ch} |")
    return out


def to_markdown(meta: dict, rs: Sequence[Row]) -> str:
    out = [f"### `{meta.get('property')}` on SGLang {meta.get('release')} "
           f"(scenario `{meta.get('scenario')}`, {len(rs)} steps)", ""]
    out += [f"> {line}" for line in header(meta, rs)] + [""]
    return "\n".join(out + markdown_table(meta, rs)) + "\n"


def _lane_of_msg(m: Msg) -> Tuple[str, str]:
    return {"metadata": ("D", "P"), "abort": ("D", "P"), "recompute": ("D", "P"),
            "chunk": ("P", "X"), "write": ("X", "X"), "stray": ("X", "X"), "status": ("X", "D"),
            "ack": ("P", "D")}[m.kind]


@attrs.frozen
class Item:
    """One line of a sequence diagram, whatever draws it: a note over a lane
    (``arrow`` None) or an arrow from lane ``lane`` to lane ``arrow``
    (``dashed`` for an answer); ``violating`` marks the violating step's
    items, ``loop`` the items inside a lasso's loop."""

    lane: str  # C, P, X or D
    text: str
    arrow: Optional[str] = None
    dashed: bool = False
    violating: bool = False
    loop: bool = False


def sequence(meta: dict, steps, states, events, violating_last: bool) -> List[Item]:
    """The trace as a sequence diagram's lines: per step, a note over its
    actor's lane, the messages and KV writes it sent, and the answers it
    streamed; what ``to_mermaid`` and ``to_svg`` both draw."""
    out: List[Item] = []
    loop = meta.get("loop")
    for i, step in enumerate(steps):
        actor = LANE_IDS[BY_NAME[step.action].actor]
        in_loop = loop is not None and i >= loop
        viol = violating_last and i == len(steps) - 1 and loop is None
        mark = dict(violating=viol, loop=in_loop)
        msgs, _ = net_changes(states[i], states[i + 1])
        arrows = [Item("X", f"write r{e.rid} KV into pages {fmt(e.pages)}", "D", **mark)
                  for e in events[i] if isinstance(e, ev.Write)]
        for m in msgs:
            a, b = _lane_of_msg(m)
            arrows.append(Item(a, _msg(m, states[i + 1].prefill_ranks), b, **mark))
        arrows += [Item(LANE_IDS[e.side], f"r{e.rid} answered {e.status}", "C", dashed=True,
                        **mark) for e in events[i] if isinstance(e, ev.Stream)]
        if step.action in ("p_intake", "d_intake"):
            after = states[i + 1]
            pages = (after.p[step.rid].origin_pages if step.action == "p_intake"
                     else after.d[step.rid].origin_pages)
            arrows.insert(0, Item("C", f"r{step.rid} ({fmt(pages)} pages after intake)",
                                  "P" if step.action == "p_intake" else "D", **mark))
        notes = [_event_in_state(e, states[i]) for e in events[i]
                 if not isinstance(e, (ev.Stream, ev.Write))]
        out.append(Item(actor, str(step) + (": " + ", ".join(notes) if notes else ""), **mark))
        out += arrows
        if viol:
            out.append(Item(actor, f"⚠ violates {meta.get('property')}", **mark))
    if loop is None and meta.get("request") is not None:
        out.append(Item("C", f"r{meta['request']} waits: {ends_text(meta)}"))
    return out


def to_mermaid(meta: dict, steps, states, events, violating_last: bool) -> str:
    out = ["sequenceDiagram", "    autonumber"]
    for key, name in LANES.items():
        out.append(f"    participant {LANE_IDS[key]} as {name}")
    in_loop = in_rect = False
    for item in sequence(meta, steps, states, events, violating_last):
        if item.loop and not in_loop:
            out.append(f"    loop forever: r{meta.get('request')} is never answered")
            in_loop = True
        if item.violating and not in_rect:
            out.append("    rect rgb(255, 215, 215)")
            in_rect = True
        elif in_rect and not item.violating:
            out.append("    end")
            in_rect = False
        pad = "        " if item.violating else "    "
        # ';' and '#' end or escape a Mermaid statement: keep them out of labels
        text = item.text.replace(";", ",").replace("#", "no.")
        if item.arrow is None:
            out.append(f"{pad}Note over {item.lane}: {text}")
        else:
            out.append(f"{pad}{item.lane}{'-->>' if item.dashed else '->>'}{item.arrow}: "
                       f"{text}")
    if in_rect:
        out.append("    end")
    if in_loop:
        out.append("    end")
    return "\n".join(out) + "\n"


def to_svg(meta: dict, steps, states, events, violating_last: bool) -> str:
    """The same sequence diagram as a self-contained SVG (no script, no
    network): a lifeline per lane, a row per item, the violating step's rows
    on red, a lasso's loop on grey."""
    from xml.sax.saxutils import escape as xml
    items = sequence(meta, steps, states, events, violating_last)
    lanes = list(LANE_IDS.values())
    names = {LANE_IDS[k]: v for k, v in LANES.items()}
    col, row, top, left = 300, 26, 50, 40
    x = {lane: left + col // 2 + k * col for k, lane in enumerate(lanes)}
    width, height = left * 2 + col * len(lanes), top + row * (len(items) + 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="sequence diagram of {xml(str(meta.get("property", "")))}">']
    for k, item in enumerate(items):
        y = top + row * k
        if item.violating or item.loop:
            fill = "#ffd7d7" if item.violating else "#eeeeee"
            out.append(f'<rect x="0" y="{y}" width="{width}" height="{row}" fill="{fill}" '
                       f'class="{"violating" if item.violating else "loop"}"/>')
    for lane in lanes:
        out.append(f'<line x1="{x[lane]}" y1="{top - 10}" x2="{x[lane]}" y2="{height}" '
                   'stroke="#999"/>')
        out.append(f'<text x="{x[lane]}" y="{top - 20}" text-anchor="middle" '
                   f'font-weight="bold">{names[lane]}</text>')
    for k, item in enumerate(items):
        y = top + row * k + row // 2
        # a note stays in its lane's column (the full text is its tooltip and
        # is in the step table)
        span = 42 if item.arrow is None or item.arrow == item.lane else \
            42 * abs(lanes.index(item.arrow) - lanes.index(item.lane))
        text = xml(item.text if len(item.text) <= span else item.text[:span - 3] + "...")
        title = f"<title>{xml(item.text)}</title>"
        if item.arrow is None or item.arrow == item.lane:
            out.append(f'<g>{title}<rect x="{x[item.lane] - col // 2 + 6}" y="{y - 9}" '
                       f'width="{col - 12}" height="18" rx="3" fill="#fff8c4" stroke="#c9b800"/>'
                       f'<text x="{x[item.lane]}" y="{y + 4}" text-anchor="middle">{text}</text>'
                       "</g>")
        else:
            x1, x2 = x[item.lane], x[item.arrow]
            head = -6 if x2 > x1 else 6
            dash = ' stroke-dasharray="4 3"' if item.dashed else ""
            out.append(f'<g>{title}<line x1="{x1}" y1="{y + 4}" x2="{x2}" y2="{y + 4}" '
                       f'stroke="#333"{dash}/><polygon points="{x2},{y + 4} {x2 + head},{y} '
                       f'{x2 + head},{y + 8}" fill="#333"/><text x="{(x1 + x2) // 2}" '
                       f'y="{y}" text-anchor="middle">{text}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _node_label(s: State) -> str:
    parts = []
    for r, (p, d) in enumerate(zip(s.p, s.d)):
        parts.append(f"r{r}: P {fmt(p.stage)} / D {fmt(d.stage)}")
    return "\\n".join(parts)


def to_dot(meta: dict, steps, states, violating_last: bool) -> str:
    out = [f'digraph "{meta.get("property")}-{meta.get("release")}" {{', "  rankdir=TB;",
           '  node [shape=box, fontname="monospace", fontsize=10];']
    for i, s in enumerate(states):
        bad = violating_last and i == len(states) - 1
        style = ', style=filled, fillcolor="#ffd7d7"' if bad else ""
        out.append(f'  s{i} [label="{i}\\n{_node_label(s)}"{style}];')
    for i, step in enumerate(steps):
        out.append(f'  s{i} -> s{i + 1} [label="{step}"];')
    if meta.get("loop") is not None:
        out.append(f'  s{len(steps)} -> s{meta["loop"]} [style=dashed, label="the same state: '
                   'the cycle repeats"];')
    out.append("}")
    return "\n".join(out) + "\n"


def to_report(meta: dict, rs: Sequence[Row], mermaid: str, trace_file: str,
              timing: Sequence = ()) -> str:
    """A bug report to paste upstream: what the finding is and what it needs
    (from ``reqmodel/findings.toml`` when the trace shows one), the steps as
    a Markdown table, the Mermaid sequence diagram, and how to replay it."""
    from reqmodel import findings
    prop, sc, rel = meta.get("property"), meta.get("scenario"), meta.get("release")
    f = findings.lookup(prop or "", sc or "")
    p = CATALOG.get(prop or "")
    out = [f"## {f.title if f else f'`{prop}` violated on SGLang {rel}'}", ""]
    out.append(f"**SGLang {rel}**, found by reqmodel in scenario `{sc}` "
               f"({len(rs)} steps): `{prop}`: {p.text if p else ''}")
    out.append("")
    if f is None:
        out += ["*This trace is not one of reqmodel's recorded findings: state the "
                "configuration (flags, environment, backend) and the timing it needs "
                "before reporting it.*", ""]
    else:
        out += [f"- **Severity:** {f.severity} ({f.status})",
                f"- **Configuration:** {f.configuration}",
                f"- **Timing:** {f.timing}",
                f"- **Closest upstream:** {'; '.join(f.upstream)}",
                f"- **What an operator can change:** {f.fix}", "",
                f.summary, ""]
    # the timeout settings this trace needs, derived from its steps (clocks.needs)
    out += [f"- **Timeout setting the trace needs:** {n}" for n in timing]
    out += [""] if timing else []
    wait = liveness_lines(meta, rs)
    out += wait + ([""] if wait else [])
    out += ["<details><summary>Every step, with the state it changes</summary>", ""]
    out += markdown_table(meta, rs)
    out += ["", "</details>", "", "```mermaid", mermaid.rstrip("\n"), "```", "",
            "Replay it on any release, or with a proposed guard change:", "", "```sh",
            f"reqmodel replay {trace_file}",
            f"reqmodel replay {trace_file} --release 0.5.23",
            f"reqmodel replay {trace_file} --guards my-fix.py", "```", ""]
    return "\n".join(out)
