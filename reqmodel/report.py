"""``reqmodel report``: the verdict matrix as a page a person opens in a
browser. One self-contained HTML file per page (inline CSS and SVG, no
script, no network): ``index.html`` with the counts per release and, per
scenario, a property x release table whose violated cells link to a page of
their own, with the counterexample as a sequence diagram (``render.to_svg``,
the lines ``show --format mermaid`` draws) and as the step table ``show``
prints, next to its ITF file. Written through ``output`` like every command's
files: all or none."""
from __future__ import annotations

import html
import pathlib
from typing import Dict, List, Sequence

from reqmodel import output
from reqmodel.engines.base import Result, safe_name
from reqmodel.model.properties import CATALOG

CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; font-size: 13px; }
th { background: #f2f2f2; }
td.violated { background: #f4b6b6; font-weight: bold; }
td.holds { background: #cdeccd; }
td.not-applicable { background: #eeeeee; color: #777; }
td.violated a { color: #7a0000; }
tr.violating td { background: #ffd7d7; }
.muted { color: #666; }
code { background: #f4f4f4; padding: 1px 4px; }
"""

CELL_TEXT = {"violated": "violated", "holds": "holds", "not-applicable": "n/a",
             "not-checked": "not checked"}


def _page(title: str, body: List[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _cell_path(r: Result) -> str:
    return f"cells/{safe_name(r.release)}/{safe_name(r.property)}-{safe_name(r.scenario)}.html"


def write(out: pathlib.Path, releases: Sequence[str], scenarios, results: Sequence[Result],
          summary: Dict[str, Dict[str, int]], command: str) -> pathlib.Path:
    """Stage index.html and a page per violated cell with a trace under ``out``."""
    by = {(r.scenario, r.property, r.release): r for r in results}
    body = ["<h1>reqmodel: verdicts by scenario, property and release</h1>",
            f"<p class=\"muted\">made by <code>{html.escape(command)}</code>; every violated "
            "cell links to its counterexample.</p>",
            "<h2>Summary</h2>", "<table id=\"summary\"><tr><th>release</th>"
            + "".join(f"<th>{html.escape(k)}</th>" for k in ("violated", "holds",
                                                             "not-applicable"))
            + "</tr>"]
    for rel in releases:
        counts = summary.get(rel, {})
        body.append(f"<tr><td>{html.escape(rel)}</td>"
                    + "".join(f"<td>{counts.get(k, 0):,}</td>" for k in
                              ("violated", "holds", "not-applicable")) + "</tr>")
    body.append("</table>")
    for sc in scenarios:
        body.append(f"<h2 id=\"{html.escape(safe_name(sc.name))}\">scenario "
                    f"{html.escape(sc.name)}</h2>")
        body.append(f"<p class=\"muted\">{html.escape(' '.join(sc.description.split()))}</p>")
        body.append("<table class=\"matrix\"><tr><th>property</th>"
                    + "".join(f"<th>{html.escape(r)}</th>" for r in releases) + "</tr>")
        for prop in CATALOG:
            cells = [by.get((sc.name, prop, rel)) for rel in releases]
            if all(c is None for c in cells):
                continue
            row = [f"<td title=\"{html.escape(CATALOG[prop].text)}\">{html.escape(prop)}</td>"]
            for rel, r in zip(releases, cells):
                verdict = "" if r is None else str(r.verdict)
                text = CELL_TEXT.get(verdict, verdict)
                if r is not None and r.trace_length is not None and verdict == "violated":
                    text += f" ({r.trace_length})"
                attrs = (f"class=\"{html.escape(verdict)}\" data-release=\"{html.escape(rel)}\" "
                         f"data-scenario=\"{html.escape(sc.name)}\" "
                         f"data-property=\"{html.escape(prop)}\"")
                if verdict == "violated" and r.trace_file:
                    text = f"<a href=\"{html.escape(_cell_path(r))}\">{html.escape(text)}</a>"
                    _cell_page(out, r, sc)
                else:
                    text = html.escape(text)
                row.append(f"<td {attrs}>{text}</td>")
            body.append("<tr>" + "".join(row) + "</tr>")
        body.append("</table>")
    index = out / "index.html"
    output.write_text(index, _page("reqmodel verdicts", body))
    return index


def _cell_page(out: pathlib.Path, r: Result, sc) -> None:
    from reqmodel.traces import render
    from reqmodel.traces import replay as rp
    loaded = rp.load(r.trace_file)
    run = rp.run(loaded)
    violating = rp.violating_last(loaded, run)
    rows = render.rows(loaded.steps, run.states, run.events, violating)
    svg = render.to_svg(loaded.meta, loaded.steps, run.states, run.events, violating)
    page = out / _cell_path(r)
    trace = pathlib.Path(r.trace_file).resolve()
    rel_trace = pathlib.Path(*([".."] * 2), trace.relative_to(out.resolve())) \
        if out.resolve() in trace.parents else trace
    body = [f"<p><a href=\"../../index.html#{html.escape(safe_name(sc.name))}\">&larr; the "
            "verdict matrix</a></p>",
            f"<h1>{html.escape(r.property)} violated on {html.escape(r.release)}, scenario "
            f"{html.escape(sc.name)}</h1>",
            f"<p>{html.escape(CATALOG[r.property].text)}</p>",
            f"<p class=\"muted\">{html.escape(' '.join(sc.description.split()))}</p>",
            f"<p>Shortest counterexample: {r.trace_length} steps, "
            f"<a href=\"{html.escape(str(rel_trace))}\">ITF trace</a>; replay it with "
            f"<code>reqmodel replay {html.escape(r.trace_file)}</code>.</p>",
            "<h2>Sequence diagram</h2>", svg,
            "<h2>Steps</h2>", "<table class=\"steps\"><tr><th>#</th><th>actor</th>"
            "<th>action</th><th>what happened</th><th>state changed</th></tr>"]
    for row in rows:
        cls = " class=\"violating\"" if row.violating else ""
        body.append(f"<tr{cls}><td>{row.index}</td><td>{html.escape(row.actor)}</td>"
                    f"<td>{html.escape(row.action)}</td>"
                    f"<td>{'<br>'.join(html.escape(e) for e in row.events) or '—'}</td>"
                    f"<td>{'<br>'.join(html.escape(c) for c in row.changed) or '—'}</td></tr>")
    body.append("</table>")
    output.write_text(page, _page(f"{r.property} on {r.release}, {sc.name}", body))
