"""The ``reqmodel`` command line.

Every error a user can cause (bad scenario or trace file, unknown release,
property or scenario name, a bound too large for the machine) is reported as
one line on stderr with exit status 2, never a traceback.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Dict, List, Optional, Tuple

import click
from rich.console import Console
from rich.table import Table
from rich.markup import escape

from reqmodel.model import properties as props_mod
from reqmodel.model import releases as rel_mod
from reqmodel.model import scenario as sc_mod
from reqmodel.engines import exhaustive as exhaustive_mod
from reqmodel.engines.base import BUDGET_NOTE, Budget, ENGINES, EngineInputError, NetBoundError, run
from reqmodel.engines import parallel
from reqmodel.engines.exhaustive import BoundExceeded, DEFAULT_MAX_STATES
from reqmodel.traces.itf import TraceFileError
from reqmodel.audit.derive import ASSUMPTIONS as _ASSUMPTIONS


class UserError(Exception):
    """An error to report in one line with exit status 2."""


from reqmodel.proposals.proposal import ProposalError  # noqa: E402
from reqmodel import messages, output, usercode  # noqa: E402
from reqmodel.conform import ConformError  # noqa: E402
from reqmodel.model.properties import Kind

_USER_ERRORS = (UserError, sc_mod.ScenarioError, rel_mod.ReleaseError,
                props_mod.PropertyError, TraceFileError, BoundExceeded, ProposalError,
                ConformError, EngineInputError, usercode.UserCodeError,
                output.OutputError)


def _complete(options, incomplete: str):
    """Shell completion of one item of a comma list (click's own completion,
    README "Set up")."""
    from click.shell_completion import CompletionItem
    head, _, last = incomplete.rpartition(",")
    prefix = head + "," if head else ""
    return [CompletionItem(prefix + o) for o in options if o.startswith(last)]


def _complete_scenario(ctx, param, incomplete):
    return _complete(("all", "large") + sc_mod.builtin_names() + sc_mod.large_names(), incomplete)


def _complete_release(ctx, param, incomplete):
    return _complete(("all",) + tuple(rel_mod.NAMES), incomplete)


def _complete_property(ctx, param, incomplete):
    return _complete(tuple(props_mod.CATALOG), incomplete)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="reqmodel")
def cli() -> None:
    """Model SGLang's request lifecycle and PD KV handoff, and check it."""


def _scenarios(names: Tuple[str, ...], files: Tuple[str, ...],
               bounds: sc_mod.Bounds = sc_mod.EXHAUSTIVE,
               default: Tuple[str, ...] = (sc_mod.DEFAULT,)) -> List[sc_mod.Scenario]:
    """``--scenario`` names (``all``: the exhaustive engine's built-ins;
    ``large``: those beyond its reach) and ``--scenario-file`` files;
    ``default`` when neither is given."""
    out: List[sc_mod.Scenario] = []
    parts = [part.strip() for name in names for part in name.split(",")]
    if not all(parts):
        raise UserError("--scenario: an empty scenario name (give names such as "
                        "incident,retract-abort, or all)")
    for name in parts:
        if name == "all":
            out.extend(sc_mod.builtin(n) for n in sc_mod.builtin_names())
        elif name == "large":
            out.extend(sc_mod.builtin(n) for n in sc_mod.large_names())
        else:
            out.append(sc_mod.builtin(name))
    out.extend(sc_mod.load_file(f, bounds) for f in files)
    return out or [sc_mod.builtin(n) for n in default]


try:
    _NAME_MAX = os.pathconf("/", "PC_NAME_MAX")
except (AttributeError, OSError, ValueError):  # not POSIX
    _NAME_MAX = 255


def _out_dir(out: str, option: str = "--out") -> pathlib.Path:
    """``--out`` as a directory that can be made: refused in one line when a
    part of it is a file, or the name is not a usable path."""
    if "\0" in out or not out.strip():
        raise UserError(f"{option} must name a directory")
    path = pathlib.Path(out)
    if any(len(os.fsencode(name)) > _NAME_MAX for name in path.parts):
        raise UserError(f"{option} {messages.short(out)}: a name in it is longer than the "
                        f"file system allows ({_NAME_MAX} bytes)")
    for part in (path, *path.parents):
        try:
            exists = part.exists()
        except OSError as e:  # a name too long for the file system, and the like
            raise UserError(f"{option} {messages.short(out)}: {e.strerror}")
        if exists:
            if not part.is_dir():
                raise UserError(f"{option} {out}: {part} is a file, not a directory")
            break
    return path


def _workers(workers: Optional[int]) -> int:
    """--workers, or $REQMODEL_WORKERS, or every core."""
    if workers is not None:
        return workers
    try:
        return parallel.workers_from_env()
    except ValueError as e:
        raise UserError(str(e))


def _command_line(name: str) -> str:
    """The command as the user typed it, for a report to record."""
    import shlex
    return ("reqmodel " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == [name]
            else f"reqmodel {name} ...")


def _pair_line(sc: sc_mod.Scenario, rel, pair) -> str:
    """The progress line of one exhaustive release x scenario."""
    return f"[dim]{escape(sc.name)} on {rel.name}: {pair[0].states:,} states, " \
           f"{pair[0].seconds:.2f} s[/]"


def _console() -> Console:
    """A console as wide as the table needs when output is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=160)


# --engine z3: the default and largest --depth (the cost grows steeply with it)
Z3_DEFAULT_DEPTH = ENGINES["z3"].DEFAULT_DEPTH
# the default time budgets of the sampling engines, for the whole command
BUDGET = {"hypothesis": 60.0, "z3": 120.0}
Z3_MAX_DEPTH = ENGINES["z3"].MAX_DEPTH

_CELL = {"holds": "[green]holds[/]", "violated": "[bold red]violated[/]",
         "not-applicable": "[dim]n/a[/]", "not-checked": "[dim]not checked[/]"}

# the Z3 engine's bounded answers
_BOUNDED = {"holds-to-depth": "[green]holds[/] to depth {}",
            "unreached-to-depth": "[yellow]not reached[/] to depth {}"}


def _cell(r) -> str:
    if getattr(r, "proved", False):
        return "[green]proved[/]" if r.kind == Kind.ALWAYS else "[bold red]unreachable[/] (proved)"
    if r.verdict == "unreached-to-depth" and r.depth is None:  # sampled: no depth
        return "[yellow]not reached[/]"
    if r.verdict in _BOUNDED:
        return _BOUNDED[r.verdict].format(r.depth)
    text = _CELL[r.verdict]
    if r.trace_length is not None:
        text += f" ({r.trace_length})"
    if r.kind == Kind.SOMETIMES and r.verdict == "violated":
        text = "[bold red]unreachable[/]"
    elif r.kind == Kind.SOMETIMES and r.verdict == "holds":
        text = f"[green]reachable[/] ({r.trace_length})"
    return text


@cli.command()
@click.option("--release", "release", default="all", show_default=True,
              shell_complete=_complete_release,
              help="A release (0.5.19 ... 0.5.23), a comma-separated list, or 'all'.")
@click.option("--scenario", "scenario_names", multiple=True, shell_complete=_complete_scenario,
              help="A built-in scenario, a comma list of them, 'all' (every built-in one "
                   "the exhaustive engine answers) or 'large' (those beyond it) (repeatable; "
                   "default: incident; with --engine hypothesis: large).")
@click.option("--scenario-file", "scenario_files", multiple=True,
              type=click.Path(dir_okay=False), help="A scenario TOML file.")
@click.option("--property", "prop_names", multiple=True, shell_complete=_complete_property,
              help="Check only this property (repeatable, or a comma-separated list; default: "
                   "the whole catalog).")
@click.option("--engine", type=click.Choice(list(ENGINES)),
              default="exhaustive", show_default=True, help="Checking engine.")
@click.option("--depth", type=int, default=None,
              help=f"z3: the most steps searched (default {Z3_DEFAULT_DEPTH}, at most {Z3_MAX_DEPTH}).")
@click.option("--seconds", "z3_seconds", type=float, default=None,
              help="hypothesis and z3: the time budget of the whole command, shared out over "
                   f"its cells (default {BUDGET['hypothesis']:g} s for hypothesis, "
                   f"{BUDGET['z3']:g} s for z3); z3 stops deepening where its share ends and "
                   "reports the depth reached.")
@click.option("--per-release", is_flag=True,
              help="--seconds is for each release, not for the whole command.")
@click.option("--no-budget", is_flag=True,
              help="hypothesis: run every example of the profile (the pinned ci table); "
                   "z3: search to --depth whatever it takes.")
@click.option("--max-net", type=int, default=8, show_default=True,
              help="z3: message slots of the state vector (messages in flight at once).")
@click.option("--hypothesis-profile", "hprofile", type=click.Choice(["dev", "ci", "thorough"]),
              default="ci", show_default=True, help="Budget of the hypothesis engine.")
@click.option("--out", "out", type=click.Path(file_okay=False), default="reqmodel-out",
              show_default=True, help="Where counterexample traces (ITF) are written (the committed corpus is regenerated with --out counterexamples).")
@click.option("--witnesses", is_flag=True,
              help="Also write the shortest path of each reachability property.")
@click.option("--max-states", type=click.IntRange(min=1), default=DEFAULT_MAX_STATES,
              show_default=True, help="Refuse scenarios with more distinct states than this.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="exhaustive: worker processes for a large search (default: "
                   "$REQMODEL_WORKERS, else every core); the answer is the same.")
@click.option("--fingerprints", is_flag=True,
              help="exhaustive: keep a 64-bit fingerprint of each visited state instead of "
                   "the state (about a third of the memory, one process); the liveness "
                   "properties are then checked in their deadlock forms only.")
@click.option("--ray", "ray_address", metavar="ADDRESS", default=None,
              help="exhaustive: hold the visited set's shards as actors on the Ray cluster "
                   "at ADDRESS ('local' starts one here, 'auto' finds a running one), "
                   "--workers of them (default: the cluster's CPUs); the answer is the same. "
                   "Needs pip install 'reqmodel[ray]'.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def check(release, scenario_names, scenario_files, prop_names, engine, depth, z3_seconds,
          per_release, no_budget, max_net, hprofile, out, witnesses, max_states, workers,
          fingerprints, ray_address, as_json) -> None:
    """Check properties on releases and scenarios; write counterexamples.

    Exit status 0 when the check ran, whatever the verdicts; 2 on bad input.
    """
    releases = rel_mod.resolve(release)
    if not releases:
        raise UserError("--release names no release")
    if engine != "z3" and depth is not None:
        raise UserError("--depth is for --engine z3")
    if engine == "exhaustive" and (z3_seconds is not None or per_release or no_budget):
        raise UserError("--seconds, --per-release and --no-budget are for --engine "
                        "hypothesis and z3")
    if no_budget and (z3_seconds is not None or per_release):
        raise UserError("--no-budget takes no --seconds or --per-release")
    if z3_seconds is not None and z3_seconds <= 0:
        raise UserError("--seconds must be positive")
    if engine != "exhaustive" and (workers is not None or fingerprints or ray_address):
        raise UserError("--workers, --fingerprints and --ray are for --engine exhaustive")
    if fingerprints and workers is not None and workers > 1:
        raise UserError("--fingerprints runs in one process: drop --workers")
    if fingerprints and ray_address:
        raise UserError("--fingerprints runs in one process: drop --ray")
    if ray_address is not None:
        from reqmodel.engines import raycluster
        cpus = raycluster.cluster_cpus(ray_address)  # joins now: a bad address fails first
        workers = cpus if workers is None else workers
    workers = 1 if fingerprints else _workers(workers)
    if engine == "z3":
        depth = Z3_DEFAULT_DEPTH if depth is None else depth
        if not 1 <= depth <= Z3_MAX_DEPTH:
            raise UserError(f"--depth must be 1 to {Z3_MAX_DEPTH} "
                            "(notes/performance.md: depth 16 on incident takes 7 minutes)")
        if not 1 <= max_net <= 64:
            raise UserError("--max-net must be 1 to 64")
    # the Hypothesis engine holds one state at a time: it takes scenario files
    # beyond the exhaustive checker's bounds
    # the Hypothesis engine's default: the built-in scenarios only it answers
    scenarios = _scenarios(scenario_names, scenario_files,
                           sc_mod.SAMPLED if engine == "hypothesis" else sc_mod.EXHAUSTIVE,
                           sc_mod.large_names() if engine == "hypothesis" else (sc_mod.DEFAULT,))
    props = props_mod.select(prop_names)
    console = Console(stderr=True)
    if engine == "exhaustive":
        _size_check(scenarios, max_states, fingerprints, console, quiet=as_json)

    def progress(sc, rel, pair):
        if as_json:
            return
        if engine == "exhaustive":
            console.print(_pair_line(sc, rel, pair))
        else:
            what = f"z3 to depth {depth}" if engine == "z3" else f"hypothesis ({hprofile})"
            console.print(f"[dim]{escape(sc.name)} on {rel.name}: {what} done[/]")

    budget = None
    if engine != "exhaustive" and not no_budget:
        seconds = BUDGET[engine] if z3_seconds is None else z3_seconds
        if per_release:
            seconds *= len(releases)
        # a share per release x scenario pair (the Hypothesis engine searches
        # for a pair's properties together)
        budget = Budget(seconds, len(releases) * len(scenarios))
    live = _LiveStatus(console, enabled=not as_json)
    options = {"exhaustive": dict(max_states=max_states, workers=workers,
                                  fingerprints=fingerprints, ray=ray_address),
               "hypothesis": dict(profile=hprofile, budget=budget, progress=live.hypothesis),
               "z3": dict(depth=depth, max_net=max_net, budget=budget,
                          progress=live.z3)}[engine]
    checker = ENGINES[engine](**options)
    try:
        with live, exhaustive_mod.reporting(live.exhaustive):
            results = run(checker, releases, scenarios, props, _out_dir(out),
                          progress=progress, write_witnesses=witnesses)
    except NetBoundError as e:
        raise UserError(f"{e}: raise --max-net")
    summary = _summary(releases, results)
    searched = None if budget is None else {
        "budget_seconds": round(budget.seconds, 1),
        "seconds": round(budget.seconds - budget.left(), 1),
        "cells_cut_by_budget": budget.cut}
    if as_json:  # the answer first: counts per release (and what was searched), then every cell
        data = {"summary": summary, **({} if searched is None else {"searched": searched}),
                "results": [r.as_json() for r in results]}
        click.echo(json.dumps(data, indent=1))
        return
    stdout = _console()
    for sc in scenarios:
        table = Table(title=f"scenario {escape(sc.name)}", title_justify="left")
        table.add_column("property", no_wrap=True)
        for rel in releases:
            table.add_column(rel.name, no_wrap=True)
        for p in props:
            row = [p.name]
            for rel in releases:
                r = next(x for x in results if x.scenario == sc.name and x.release == rel.name
                         and x.property == p.name)
                row.append(_cell(r))
            table.add_row(*row)
        stdout.print(table)
    files = sorted({r.trace_file for r in results if r.trace_file})
    if files:
        stdout.print(f"{len(files)} trace file(s) written under {out}/", markup=False,
                     highlight=False)
    timed: Dict[Tuple[str, str, str], List[str]] = {}
    for r in results:
        for need in {n.setting() for n in r.timing}:
            timed.setdefault((r.property, r.scenario, need), []).append(r.release)
    for (prop, sc_name, need), rels in sorted(timed.items()):
        stdout.print(f"timing: {prop} on {sc_name} ({', '.join(rels)}): the counterexample {need}",
                     markup=False, highlight=False)
    for prop, note in sorted({(r.property, r.note) for r in results
                              if r.note and r.note != BUDGET_NOTE}):
        stdout.print(f"{prop}: {note}", markup=False, highlight=False)
    if searched is not None:
        stdout.print(f"searched for {searched['seconds']:g} s of a "
                     f"{searched['budget_seconds']:g} s budget; the budget ended the search on "
                     f"{budget.cut} of {len(results)} cells"
                     + (" (--seconds gives more, --no-budget runs the profile in full)"
                        if budget.cut else ""), highlight=False)
    if engine == "hypothesis":
        ex, st_, runs = checker.examples, checker.steps, checker.runs
        stdout.print(f"hypothesis ({hprofile}): {ex:,} examples, {runs:,} runs, {st_:,} steps; "
                     "(n) = length of "
                     "the minimised counterexample; 'holds' = none found within the budget")
    elif engine == "z3":
        stdout.print("z3: 'holds to depth k' = no violation of at most k steps; 'proved' = none "
                     "of any length (no simple path was left at some depth); (n) = length of the "
                     "shortest counterexample, or of the shortest path to the good state")
    else:
        stdout.print("(n) = length of the shortest counterexample, or of the shortest path to "
                     "the good state")
    if len(scenarios) > 1 or len(releases) > 1:
        for name, counts in summary.items():
            stdout.print(_summary_line(name, counts, len(scenarios)), highlight=False)


def _size_check(scenarios, max_states: int, fingerprints: bool, console: Console,
                quiet: bool) -> None:
    """Before any work: refuse what the exhaustive engine does not take
    (``refuse_large``: a large built-in scenario, or estimated states beyond
    --max-states or the machine's memory even at the estimate's low end);
    say the estimate of a scenario that is not built in (a built-in one's
    is measured)."""
    from reqmodel.engines.base import refuse_large
    from reqmodel.engines.estimate import estimate
    builtin = set(sc_mod.builtin_names())
    for sc in scenarios:
        refuse_large(sc, max_states, fingerprints)
        if sc.name not in builtin and not quiet:
            console.print(f"[dim]{escape(sc.name)}: {escape(estimate(sc).describe())}; the "
                          f"search stops at --max-states {max_states:,}[/]", highlight=False)


class _LiveStatus:
    """One status line on a terminal's stderr while an engine runs (the
    exhaustive one's states, depth, frontier and rate; Hypothesis's examples,
    cell and time left; Z3's depth, answered and open properties and time
    left); nothing elsewhere."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled and console.is_terminal
        self.live = None

    def __enter__(self):
        if self.enabled:
            from rich.live import Live
            self.live = Live("", console=self.console, transient=True, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)
        return False

    def exhaustive(self, info: Dict) -> None:
        if self.live is not None:
            rate = info["states"] / max(info["seconds"], 1e-9)
            self.live.update(f"[dim]exhaustive: {info['states']:,} states, depth "
                             f"{info['depth']}, frontier {info['frontier']:,}, "
                             f"{rate:,.0f} states/s[/]")

    def z3(self, info: Dict) -> None:
        if self.live is not None:
            left = "" if info["left"] is None else f"; {info['left']:.0f} s left"
            self.live.update(f"[dim]z3: {escape(info['scenario'])} on {info['release']}, depth "
                             f"{info['depth']} of {info['max_depth']}, {info['answered']} "
                             f"answered, {info['open']} open{left}[/]")

    def hypothesis(self, info: Dict) -> None:
        if self.live is not None:
            self.live.update(f"[dim]hypothesis: {info['examples']:,} examples; now "
                             f"{escape(info['scenario'])} on {info['release']}, "
                             f"{info['property']}; {info['left']:.0f} s left[/]")


def _summary(releases, results) -> Dict[str, Dict[str, int]]:
    """Per release, how many cells have each verdict (violated first)."""
    order = ["violated", "holds", "holds-to-depth", "unreached-to-depth", "not-checked",
             "not-applicable"]
    out: Dict[str, Dict[str, int]] = {}
    for rel in releases:
        counts = {k: 0 for k in order}
        for r in results:
            if r.release == rel.name:
                counts[str(r.verdict)] = counts.get(str(r.verdict), 0) + 1
        out[rel.name] = {k: v for k, v in counts.items() if v or k in ("violated", "holds")}
    return out


def _summary_line(release: str, counts: Dict[str, int], scenarios: int) -> str:
    words = {"violated": "violated", "holds": "hold", "holds-to-depth": "hold to depth",
             "unreached-to-depth": "not reached to depth", "not-checked": "not checked",
             "not-applicable": "not applicable"}
    parts = ", ".join(f"{n:,} {words.get(k, k)}" for k, n in counts.items())
    return f"{release}: {parts} (over {scenarios} scenario{'s' * (scenarios != 1)})"


@cli.command("report")
@click.option("--release", "release", default="all", show_default=True,
              shell_complete=_complete_release,
              help="Release name(s), comma-separated, or 'all'.")
@click.option("--scenario", "scenario_names", multiple=True, shell_complete=_complete_scenario,
              help="A built-in scenario, a comma list of them, or 'all' (repeatable; "
                   "default: all).")
@click.option("--out", "out", type=click.Path(file_okay=False), default="reqmodel-report",
              show_default=True, help="Where index.html, the cell pages and the traces go.")
@click.option("--max-states", type=click.IntRange(min=1), default=DEFAULT_MAX_STATES,
              show_default=True, help="Refuse scenarios with more distinct states than this.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes for the exhaustive search (default $REQMODEL_WORKERS or every "
                   "core).")
def report_cmd(release, scenario_names, out, max_states, workers) -> None:
    """Write the verdict matrix as an HTML page to open in a browser: every
    scenario and release on the exhaustive engine, each violated cell linked
    to its counterexample drawn as a sequence diagram and a step table.
    Self-contained: no script, no network."""
    from reqmodel import report
    releases = rel_mod.resolve(release)
    scenarios = _scenarios(scenario_names or ("all",), ())
    props = props_mod.select([])
    workers = _workers(workers)
    outdir = _out_dir(out)
    console = Console(stderr=True)
    live = _LiveStatus(console, enabled=True)

    checker = ENGINES["exhaustive"](max_states=max_states, workers=workers)
    with live, exhaustive_mod.reporting(live.exhaustive):
        results = run(checker, releases, scenarios, props, outdir / "traces",
                      progress=lambda sc, rel, pair: console.print(_pair_line(sc, rel, pair)))
    index = report.write(outdir, [r.name for r in releases], scenarios, results,
                         _summary(releases, results), _command_line("report"))
    click.echo(f"report: {index} (open it in a browser)")


@cli.command("audit")
@click.option("--release", "release", required=True, shell_complete=_complete_release,
              help="The release the deployment runs (0.5.19 ... 0.5.23).")
@click.option("--prefill-args", "prefill_args", multiple=True, required=True, metavar="ARGS",
              help="The prefill server's flags, as passed to sglang (one quoted string).")
@click.option("--decode-args", "decode_args", multiple=True, required=True, metavar="ARGS",
              help="The decode server's flags, as passed to sglang (one quoted string).")
@click.option("--env", "env", multiple=True, metavar="[ROLE:]NAME=VALUE",
              help="An environment variable of both servers, or of one with prefill:/decode:.")
@click.option("--prefill-log", "prefill_log", multiple=True, type=click.Path(dir_okay=False),
              help="The prefill worker's startup log (its real KV pool and context length).")
@click.option("--decode-log", "decode_log", multiple=True, type=click.Path(dir_okay=False),
              help="The decode worker's startup log.")
@click.option("--assume", "assume", multiple=True, metavar="NAME",
              help="Traffic or faults the flags do not show, checked too: "
                   f"{', '.join(_ASSUMPTIONS)} (repeatable, or comma-separated).")
@click.option("--out", "out", type=click.Path(file_okay=False), default="reqmodel-audit",
              show_default=True, help="Where the findings' traces (ITF) are written.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes for the search (default: $REQMODEL_WORKERS, else every "
                   "core).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--markdown", "markdown", type=click.Path(dir_okay=False), default=None,
              help="Also write a Markdown report (gates, findings, traces as Mermaid diagrams).")
def audit_cmd(release, prefill_args, decode_args, env, prefill_log, decode_log, assume, out,
              workers, as_json, markdown) -> None:
    """The write-up's four acceptance gates for a PD deployment: pool-context,
    admission, transfer-read and lifetime, from the servers' own flags.

    Flags are read with the release's own definitions; the pool and context
    come from the startup logs when given. Exit status 0 when no gate fails,
    1 when one does, 2 on bad input.
    """
    from reqmodel.audit import deployment, flags, gates, report
    rel = rel_mod.get(release) if "," not in release and release != "all" else None
    if rel is None:
        raise UserError("--release takes one release (0.5.19 ... 0.5.23)")
    single = {"--prefill-args": prefill_args, "--decode-args": decode_args,
              "--prefill-log": prefill_log, "--decode-log": decode_log}
    for name, given in single.items():
        if len(given) > 1:
            raise UserError(f"{name} is given {len(given)} times: one per role")
    names = [n.strip() for a in assume for n in a.split(",") if n.strip()]
    unknown = [n for n in names if n not in _ASSUMPTIONS]
    if unknown:
        raise UserError(f"--assume {unknown[0]}: unknown (known: {', '.join(_ASSUMPTIONS)})")
    workers = _workers(workers)
    if markdown is not None and pathlib.Path(markdown).is_dir():
        raise UserError(f"--markdown {markdown} is a directory")
    try:
        settings = flags.parse_env(rel.name, list(env))
        p = deployment.role(rel.name, "prefill", prefill_args[0], settings,
                            prefill_log[0] if prefill_log else None)
        d = deployment.role(rel.name, "decode", decode_args[0], settings,
                            decode_log[0] if decode_log else None)
    except flags.AuditError as exc:
        raise UserError(str(exc))
    console = Console(stderr=True)

    def progress(sc, _rel, pair):
        if not as_json:
            console.print(f"[dim]{escape(sc.name)}: {pair[0].states:,} states, "
                          f"{pair[0].seconds:.2f} s[/]")
    result = gates.audit(rel, p, d, tuple(dict.fromkeys(names)), _out_dir(out),
                         workers, progress)
    if markdown is not None:
        output.write_text(pathlib.Path(markdown),
                          report.to_markdown(result, _command_line("audit")))
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=1))
    else:
        _print_audit(result, out, markdown)
    if any(g.verdict == "fail" for g in result.gates):
        sys.exit(1)


def _print_audit(result, out, markdown) -> None:
    from reqmodel.audit.deployment import describe
    console = _console()
    style = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}
    p, d = result.prefill, result.decode
    console.print(f"SGLang {result.release}: intake limit prefill {p.intake_limit:,} tokens "
                  f"(context {p.context_len:,}, pool {p.kv_tokens:,}), decode "
                  f"{d.intake_limit:,} (context {d.context_len:,}, pool {d.kv_tokens:,})",
                  highlight=False)
    lengths = Table(title="prompt lengths", title_justify="left")
    for col in ("tokens", "prefill", "decode"):
        lengths.add_column(col)
    for b in result.bands:
        hi = "and longer" if b.hi >= max(p.context_len, d.context_len) else f"{b.hi:,}"
        s = "bold red" if b.mismatch else None
        lengths.add_row(f"{b.lo:,} - {hi}", describe(b.prefill), describe(b.decode), style=s)
    console.print(lengths)
    table = Table(title="gates", title_justify="left", show_lines=True)
    for col in ("gate", "finding", "trace (steps)", "what to change"):
        table.add_column(col)
    for g in result.gates:
        shown = [f for f in g.findings if f.verdict != "pass"]
        head = f"{g.gate}\n{style[g.verdict]}"
        if not shown:
            table.add_row(head, "[dim]nothing found: " + escape(", ".join(
                f.check for f in g.findings) or f"{len(g.checked)} checks") + "[/]", "", "")
        for i, f in enumerate(shown):
            trace = "" if not f.trace_file else f"{escape(f.trace_file)} ({f.trace_length})"
            what = f"{style[f.verdict]} {escape(f.check)}" + (
                f" [dim]({escape(f.finding_id)})[/]" if f.finding_id else "")
            table.add_row(head if i == 0 else "", what + "\n" + escape(f.title or f.why),
                          trace, escape(f.fix))
    console.print(table)
    for n in result.notes:
        console.print(f"not modelled: {n}", markup=False, highlight=False)
    files = sum(1 for g in result.gates for f in g.findings if f.trace_file)
    if files:
        console.print(f"{files} trace(s) under {out}/; read one with 'reqmodel show TRACE'",
                      markup=False, highlight=False)
    if markdown:
        console.print(f"report: {markdown}", markup=False, highlight=False)


@cli.command("replay")
@click.argument("trace_file", type=click.Path(dir_okay=False))
@click.option("--release", default=None,
              help="Replay on this release instead of the one the trace names.")
@click.option("--guards", "guards", default=None, type=click.Path(dir_okay=False),
              help="Replay on a guard proposal (see 'reqmodel guard').")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def replay_cmd(trace_file, release, guards, as_json) -> None:
    """Re-execute a trace step by step on a release.

    Reports the first step whose guard is not enabled, and whether the
    property is still violated on what replayed.  This is how a fix is shown
    to remove a counterexample.
    """
    from reqmodel.traces import replay as rp
    if release and guards:
        raise UserError("give --release or --guards, not both")
    loaded = rp.load(trace_file, release, guards)
    out = rp.run(loaded)
    if as_json:
        click.echo(json.dumps(out.as_json()))
        return
    head = (f"{out.property} ({loaded.meta.get('scenario')}) on {out.release}: "
            f"replayed {out.steps_replayed}/{out.steps_total} steps")
    if out.first_disabled_step is not None:
        st = loaded.steps[out.first_disabled_step - 1]
        head += f"; step {out.first_disabled_step} {st} is not enabled: {out.why_not}"
    click.echo(head)
    for need in out.timing:
        click.echo(f"timing: {need}")
    if loaded.property.kind == Kind.SOMETIMES:
        click.echo("good state reached" if not out.violated else "good state NOT reached")
    elif loaded.property.kind.on_graph:
        loop = loaded.meta.get("loop")
        if not out.violated:
            click.echo("not violated: " + ("the steps do not form a fair cycle that leaves the "
                                          "request waiting" if loop is not None else
                                          "the request can still be answered from the last state"))
        elif loop is not None:
            click.echo(f"VIOLATED: the steps after state {loop} return to it, a fair cycle "
                       "that never answers the request")
        else:
            click.echo(f"VIOLATED at step {out.violated_at}: the request waits there with no "
                       "way to an answer but a timeout")
    elif out.violated:
        click.echo(f"VIOLATED at step {out.violated_at}")
    else:
        click.echo("not violated on the replayed steps")


@cli.command("show")
@click.argument("trace_file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt",
              type=click.Choice(["table", "markdown", "mermaid", "dot", "report"]),
              default="table", show_default=True,
              help="table: steps in the terminal; markdown: for an issue; mermaid: a sequence "
                   "diagram; dot: Graphviz; report: configuration, finding and both, to paste "
                   "upstream.")
@click.option("--guards", "guards", default=None, type=click.Path(dir_okay=False),
              help="The guard proposal the trace was made on (default: the one it names).")
def show_cmd(trace_file, fmt, guards) -> None:
    """Render a trace for people: a step table, Markdown for an issue, a
    Mermaid sequence diagram, DOT, or a whole report to paste upstream
    (configuration, severity and upstream references when the trace shows
    one of reqmodel's recorded findings, the table and the diagram)."""
    from reqmodel.traces import render
    from reqmodel.traces import replay as rp
    loaded = rp.load(trace_file, guards=guards)
    out = rp.run(loaded)
    if out.first_disabled_step is not None:
        raise UserError(f"{trace_file}: step {out.first_disabled_step} does not replay on "
                        f"{out.release}: {out.why_not}")
    violating = rp.violating_last(loaded, out)
    rows = render.rows(loaded.steps, out.states, out.events, violating)
    if fmt == "markdown":
        click.echo(render.to_markdown(loaded.meta, rows), nl=False)
    elif fmt == "mermaid":
        click.echo(render.to_mermaid(loaded.meta, loaded.steps, out.states, out.events,
                                     violating), nl=False)
    elif fmt == "dot":
        click.echo(render.to_dot(loaded.meta, loaded.steps, out.states, violating), nl=False)
    elif fmt == "report":
        mermaid = render.to_mermaid(loaded.meta, loaded.steps, out.states, out.events, violating)
        click.echo(render.to_report(loaded.meta, rows, mermaid, trace_file, out.timing),
                   nl=False)
    else:
        console = _console()
        for line in render.header(loaded.meta):
            console.print(line, highlight=False, markup=False)
        console.print(f"scenario settings: {sc_mod.settings_summary(loaded.scenario)}",
                      highlight=False, markup=False)
        for need in out.timing:
            console.print(f"timing: {need}", highlight=False, markup=False)
        if out.violated:
            from reqmodel.traces import explain
            caught = explain.lines(loaded.release, loaded.scenario, out.property, loaded.steps)
            if caught:
                console.print("what could have caught it (the guard points' decisions on "
                              "this trace, and the checks):", highlight=False, markup=False)
                for line in caught:
                    console.print(f"  {line}", highlight=False, markup=False)
        table = Table(show_lines=True)
        for col in ("#", "actor", "action", "what happened", "state changed"):
            table.add_column(col)
        for r in rows:
            style = "bold red" if r.violating else None
            table.add_row(str(r.index), r.actor, r.action, "\n".join(r.events) or "—",
                          "\n".join(r.changed) or "—", style=style)
        console.print(table)


@cli.group("guard")
def guard_group() -> None:
    """Check a proposed guard change before writing it in SGLang."""


@guard_group.command("points")
def guard_points_cmd() -> None:
    """List the guard points, their arguments, the fields of the views they
    receive, and what their return value means (generated from the code)."""
    g = props_mod.g
    console = _console()
    table = Table(title="guard points", title_justify="left")
    for col in ("guard point", "arguments", "returns", "meaning"):
        table.add_column(col)
    for gp in g.GUARD_POINTS.values():
        args = ", ".join(f"{a} ({g.VIEW_OF_ARG[(gp.name, a)]})" if (gp.name, a) in g.VIEW_OF_ARG
                         else a for a in gp.args)
        table.add_row(gp.name, args, gp.returns, gp.meaning)
    console.print(table)
    for view, fields in g.VIEWS.items():
        t = Table(title=f"view: {view}", title_justify="left")
        t.add_column("field")
        t.add_column("meaning")
        for name, text in fields.items():
            t.add_row(name, text)
        console.print(t)
    from reqmodel.proposals.proposal import FIELDS
    t = Table(title="proposal fields (data a proposal file may set)", title_justify="left")
    for col in ("field", "type", "meaning"):
        t.add_column(col)
    for name, (kind, meaning) in FIELDS.items():
        t.add_row(name, escape(kind), escape(meaning))
    console.print(t)
    console.print("Helpers for proposals: from reqmodel.proposal import is_aborted, finished, "
                  "is_unadmitted_reject, FINISH_ABORT, FINISH_LENGTH, REQUEUE, RETIRE, DROP, SEND, "
                  "RETIRE_CLEANUP_FULL", highlight=False, markup=False)


@guard_group.command("check")
@click.argument("proposal_file", type=click.Path(dir_okay=False))
@click.option("--scenario", "scenario_names", multiple=True, shell_complete=_complete_scenario,
              help="A built-in scenario, a comma list of them, or 'all' (repeatable; default: "
                   "every built-in one).")
@click.option("--scenario-file", "scenario_files", multiple=True,
              type=click.Path(dir_okay=False),
              help="A scenario of your own, as a TOML file (repeatable; "
                   "'reqmodel scenarios NAME' prints one to start from).")
@click.option("--engine", type=click.Choice(["exhaustive", "z3"]), default="exhaustive",
              show_default=True, help="z3: bounded to --depth, and no waste measurements.")
@click.option("--depth", type=int, default=None,
              help=f"z3: the most steps searched (default {Z3_DEFAULT_DEPTH}, at most {Z3_MAX_DEPTH}).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Where counterexamples are written (default reqmodel-out/guard/<proposal>).")
@click.option("--all", "show_all", is_flag=True,
              help="List every cell, the unchanged ones too (default: broken and fixed).")
@click.option("--no-cost", is_flag=True, help="Skip the waste measurements.")
@click.option("--max-states", type=click.IntRange(min=1), default=DEFAULT_MAX_STATES,
              show_default=True,
              help="Refuse a scenario with more distinct states than this (each side).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object, the summary first.")
def guard_check_cmd(proposal_file, scenario_names, scenario_files, engine, depth, out, show_all,
                    no_cost, max_states, as_json) -> None:
    """Run the whole property catalog on the base release and on PROPOSAL_FILE,
    on every built-in scenario (or those given), and report what it fixes,
    breaks and costs."""
    from reqmodel.proposals import guard_check as guardcheck
    from reqmodel.proposals import proposal
    if engine != "z3" and depth is not None:
        raise UserError("--depth is for --engine z3")
    if engine == "z3":
        depth = Z3_DEFAULT_DEPTH if depth is None else depth
        if not 1 <= depth <= Z3_MAX_DEPTH:
            raise UserError(f"--depth must be 1 to {Z3_MAX_DEPTH}")
        no_cost = True  # the waste measurements walk the explored graph
    prop = proposal.load(proposal_file)
    if scenario_names or scenario_files:
        scenarios = _scenarios(scenario_names, scenario_files)
    else:
        scenarios = [sc_mod.builtin(n) for n in sc_mod.builtin_names()]
    props = props_mod.select([])
    from reqmodel.engines.base import safe_name
    outdir = _out_dir(out) if out else pathlib.Path("reqmodel-out/guard") / safe_name(prop.name)
    # fast first pass: Z3 on the replaced guard points alone
    from reqmodel.engines.z3 import guard_diff as symbolic
    points = [n for n in prop.replaced if n in props_mod.g.GUARD_POINTS]
    try:
        first = symbolic.diff(symbolic.Subject(prop.base.name, prop.base),
                              symbolic.Subject(prop.path, prop.release), points=points)
    except symbolic.SymbolicError as exc:
        first = None  # not encodable: the exhaustive check still runs
        first_note = str(exc)
    unchanged = (first is not None and points and len(points) == len(prop.replaced)
                 and not prop.scenario_overrides and all(p.status != "differs" for p in first))
    pending: list = []
    rows, costs = [], {}
    if not unchanged:
        checker = (ENGINES["z3"](depth=depth) if engine == "z3"
                   else ENGINES["exhaustive"](max_states=max_states))
        try:
            rows = guardcheck.compare(prop, scenarios, props, outdir, checker, pending=pending)
        except NetBoundError as e:
            raise UserError(f"{e}: this scenario needs the exhaustive engine")
        costs = {} if no_cost else guardcheck.cost(prop, scenarios, max_states=max_states)
        guardcheck.write(pending)  # only once everything ran
    counts = {k: sum(r.change == k for r in rows) for k in CHANGE_ORDER}
    if as_json:  # the answer first: the counts, then the cells, broken first
        click.echo(json.dumps({"summary": counts,
                               "base": prop.base.name, "proposal": prop.path,
                               "replaced": list(prop.replaced),
                               "first_pass": None if first is None else [_point_json(p) for p in first],
                               "same_as_base": bool(unchanged),
                               "results": [r.as_json() for r in _by_change(rows)],
                               "cost": costs}, indent=1))
        return
    console = _console()
    header = (f"proposal {prop.path}: base {prop.base.name}, replaces "
              f"{', '.join(prop.replaced) or 'nothing'}"
              + (f", forces {prop.scenario_overrides}" if prop.scenario_overrides else ""))
    notes = [] if first is not None else [f"first pass (Z3) skipped: {first_note}"]
    for p in first or ():
        n = len(p.regions)
        what = {"same": "the base's own implementation",
                "equivalent": "decides like the base on every request state (Z3)",
                "differs": f"decides differently from the base in {n} region{'s' * (n != 1)} "
                           f"of request states (see 'reqmodel guard diff {prop.base.name} {prop.path}')"}
        notes.append(f"first pass: {p.name} {what[p.status]}")
    if unchanged:
        for line in [header, *notes, "The proposal decides exactly like its base everywhere: its "
                     "verdicts are the base's, so the exhaustive check was not run."]:
            console.print(line, highlight=False, markup=False)
        return
    # the answer first: the counts, then the broken and fixed cells with their traces
    console.print(f"{header}\n{_change_line(counts, len(scenarios))}", highlight=False,
                  markup=False)
    style = {"fixed": "green", "broken": "bold red", "no-longer-applies": "cyan",
             "still-violated": "yellow", "still-holds": "dim", "not-applicable": "dim",
             "not-checked": "dim"}
    shown = [r for r in _by_change(rows)
             if show_all or r.change in ("broken", "fixed", "no-longer-applies")]
    if shown:
        table = Table(title="changed: base -> proposal" if not show_all
                      else "every cell: base -> proposal", title_justify="left")
        for col in ("scenario", "property", "base", "proposal", "change", "counterexample"):
            table.add_column(col, no_wrap=col != "counterexample")
        for r in shown:
            cx = "" if r.trace_file is None else f"{r.trace_file} ({r.trace_length} steps)"
            table.add_row(escape(r.scenario), r.property, r.base_verdict, r.proposal_verdict,
                          f"[{style[r.change]}]{r.change}[/]", escape(cx))
        console.print(table)
    if not show_all:
        still = [f"{r.property} on {r.scenario}" for r in rows if r.change == "still-violated"]
        listed = ", ".join(still[:4]) + (f" and {len(still) - 4} more" if len(still) > 4 else "")
        console.print(f"unchanged: {counts['still-violated']} still violated"
                      + (f" ({listed})" if still else "")
                      + f", {counts['still-holds']} still hold; --all lists them, with the "
                      "traces of the violated ones", highlight=False, markup=False)
    for line in notes:
        console.print(line, highlight=False, markup=False)
    if costs:
        ct = Table(title="waste (scenarios with an intake reject, timeouts enabled for it)",
                   title_justify="left")
        for col in ("scenario", "measure", "base", "proposal"):
            ct.add_column(col)
        for name, c in costs.items():
            for key in ("rejected_acquires", "peer_acquires", "peer_hold_seconds", "timeout_only"):
                ct.add_row(escape(name), key, _cost_cell(c["base"][key]),
                           _cost_cell(c["proposal"][key]))
        console.print(ct)


CHANGE_ORDER = ("broken", "fixed", "no-longer-applies", "still-violated", "still-holds",
                "not-applicable", "not-checked")


def _by_change(rows):
    """Broken cells first, then fixed, no longer applying, still violated,
    still holding, applying on neither side."""
    return sorted(rows, key=lambda r: CHANGE_ORDER.index(r.change))


def _change_line(counts: Dict[str, int], scenarios: int) -> str:
    cells = sum(counts.values())
    return (f"{'BROKEN' if counts['broken'] else 'broken'}: {counts['broken']}, "
            f"fixed: {counts['fixed']}, "
            + (f"no longer applies: {counts['no-longer-applies']}, "
               if counts['no-longer-applies'] else "")
            + f"still violated: {counts['still-violated']}, "
            f"still hold: {counts['still-holds']}"
            + (f", not applicable: {counts['not-applicable']}" if counts['not-applicable'] else "")
            + (f", not checked by this engine: {counts['not-checked']}"
               if counts['not-checked'] else "")
            + f" ({cells} cells: properties x "
            f"{scenarios} scenario{'s' * (scenarios != 1)})")


@guard_group.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--scenario", "scenario_names", multiple=True, shell_complete=_complete_scenario,
              help="A built-in scenario (or a comma list) for the reachability column "
                   "(repeatable; default: every built-in one).")
@click.option("--no-reach", is_flag=True, help="Skip the reachability column (Z3 only: seconds).")
@click.option("--point", "points", multiple=True,
              type=click.Choice([*props_mod.g.GUARD_POINTS, *props_mod.g.FIELD_POINTS]),
              help="Only this guard point or proposal field (repeatable).")
@click.option("--max-states", type=click.IntRange(min=1), default=DEFAULT_MAX_STATES,
              show_default=True,
              help="Refuse a scenario with more distinct states than this (each side).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def guard_diff_cmd(a, b, scenario_names, no_reach, points, max_states, as_json) -> None:
    """Ask Z3 for the request states where A and B (release names or proposal
    files) decide differently, at every guard point, and whether the
    exhaustive model reaches such a state at that point under A and under B."""
    import time
    from reqmodel.engines.z3 import guard_diff as symbolic
    sa, sb = symbolic.subject(a), symbolic.subject(b)
    if no_reach and scenario_names:
        raise UserError("--scenario is for the reachability column, which --no-reach skips")
    scenarios = None
    if not no_reach:
        scenarios = (_scenarios(scenario_names, ()) if scenario_names
                     else [sc_mod.builtin(n) for n in sc_mod.builtin_names()])
    t0 = time.perf_counter()
    try:
        result = symbolic.diff(sa, sb, scenarios, max_states, points or None)
    except symbolic.SymbolicError as exc:
        raise UserError(str(exc)) from None
    seconds = time.perf_counter() - t0
    if as_json:
        click.echo(json.dumps({"a": sa.label, "b": sb.label, "seconds": round(seconds, 2),
                               "scenarios": None if scenarios is None else [s.name for s in scenarios],
                               "guard_points": [_point_json(p) for p in result]}, indent=1))
        return
    console = _console()
    console.print(f"guard diff {sa.label} -> {sb.label} ({seconds:.1f} s)", highlight=False,
                  markup=False)
    for p in result:
        if p.name in props_mod.g.FIELD_POINTS:
            what = "the same" if p.status == "same" else "differs"
            console.print(f"  {p.name}: {what} ({p.a_impl}"
                          + ("" if p.status == "same" else f" -> {p.b_impl}") + ")",
                          highlight=False, markup=False)
            continue
        if p.status != "differs":
            what = ("the same implementation" if p.status == "same" else
                    "equivalent: Z3 finds no request state where they differ")
            console.print(f"  {p.name}: {what} ({p.a_impl}"
                          + ("" if p.status == "same" else f" / {p.b_impl}") + ")",
                          highlight=False, markup=False)
            continue
        # the labels and implementations may be a proposal's path: printed as written
        t = Table(title=escape(f"{p.name}: {p.a_impl} -> {p.b_impl}"), title_justify="left")
        for col in (sa.label, sb.label, "request state (fields not named: any value)"):
            t.add_column(escape(col), no_wrap=col != "request state (fields not named: any value)")
        if scenarios is not None:
            t.add_column(escape(f"reached under {sa.label}"))
            t.add_column(escape(f"reached under {sb.label}"))
        for i, r in enumerate(p.regions):
            row = [symbolic.show(r.a), symbolic.show(r.b), "\n".join(r.fields) or "any"]
            if scenarios is not None:
                row += [", ".join(p.reached_a[i]) or "no", ", ".join(p.reached_b[i]) or "no"]
            t.add_row(*row)
        console.print(t)


def _point_json(p) -> dict:
    from reqmodel.engines.z3 import guard_diff as symbolic
    out = {"name": p.name, "status": p.status, "a": p.a_impl, "b": p.b_impl}
    if p.status == "differs" and p.name not in props_mod.g.FIELD_POINTS:
        out["regions"] = [
            {"a": symbolic.show(r.a), "b": symbolic.show(r.b), "fields": list(r.fields),
             "witness": {k: symbolic.show(v) for k, v in r.witness.items()},
             **({"reached_a": list(p.reached_a[i]), "reached_b": list(p.reached_b[i])}
                if p.reached_a else {})}
            for i, r in enumerate(p.regions)]
    return out


def _cost_cell(v) -> str:
    if isinstance(v, dict):
        return "; ".join(f"{k}: {', '.join(x) or '—'}" for k, x in v.items())
    if v is None:
        return "never released"
    if isinstance(v, list):
        return ", ".join(f"r{x}" for x in v) or "—"
    return f"{v:g} s" if isinstance(v, (int, float)) else str(v)


@cli.command("scenarios")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list: each scenario's name, description and every setting.")
def scenarios_cmd(names, as_json) -> None:
    """List the built-in scenarios and what each sets. With NAME (or a comma
    list), print its whole settings as a scenario file, to copy, edit and
    pass back with --scenario-file."""
    chosen = (_scenarios(names, ()) if names
              else [sc_mod.builtin(n) for n in sc_mod.builtin_names() + sc_mod.large_names()])
    large = set(sc_mod.large_names())
    if as_json:
        click.echo(json.dumps([{"name": sc.name, "default": sc.name == sc_mod.DEFAULT,
                                "engines": (["hypothesis"] if sc.name in large
                                            else ["exhaustive", "hypothesis", "z3"]),
                                "description": " ".join(sc.description.split()),
                                "see": _scenario_see(sc.name),
                                "settings": sc.to_dict()} for sc in chosen], indent=1))
        return
    if names:
        import tomli_w
        for k, sc in enumerate(chosen):
            if len(chosen) > 1:
                click.echo(("\n" if k else "") + f"# scenario {sc.name}")
            click.echo(tomli_w.dumps(sc.to_dict()), nl=False)
        return
    table = Table()
    table.add_column("name", no_wrap=True)
    table.add_column("requests (prompt pages)")
    table.add_column("settings")
    table.add_column("description")
    table.add_column("see")
    for sc in chosen:
        table.add_row(sc.name + (" (default)" if sc.name == sc_mod.DEFAULT else "")
                      + (" (large)" if sc.name in large else ""),
                      str(list(sc.prompt_pages)), escape(sc_mod.settings_summary(sc)),
                      escape(" ".join(sc.description.split())),
                      escape("\n".join(_scenario_see(sc.name))))
    _console().print(table)
    click.echo("'reqmodel scenarios NAME' prints one's whole settings as a scenario file; "
               "(large): beyond the exhaustive engine's reach, the default of --engine "
               "hypothesis ('--scenario large'); see: the findings recorded on the scenario (notes/findings/) and the verdict "
               "table.")


def _scenario_see(name: str) -> List[str]:
    """The findings recorded on a scenario (their pages) and the verdict table."""
    from reqmodel import findings
    return [f"notes/findings/{f.id}.md" for f in findings.load() if f.scenario == name] + [
        "notes/verdicts.md"]


@cli.command("properties")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list: each property's name, kind, gate, reference and statement.")
def properties_cmd(as_json) -> None:
    """List the property catalog, with the acceptance gate each checks in
    'reqmodel audit' (and whether its violation fails or warns there)."""
    if as_json:
        click.echo(json.dumps([{"name": p.name, "kind": str(p.kind), "gate": p.gate,
                                "on_violation": p.on_violation, "see": _see(p.name),
                                "ref": p.ref, "statement": p.text}
                               for p in props_mod.CATALOG.values()], indent=1))
        return
    table = Table()
    for col in ("name", "kind", "gate", "see", "statement"):
        table.add_column(col)
    for p in props_mod.CATALOG.values():
        table.add_row(p.name, p.kind, f"{p.gate} ({p.on_violation})",
                      escape("\n".join(_see(p.name))), p.text)
    _console().print(table)
    click.echo("gate: the write-up's acceptance gate the property checks in 'reqmodel audit'; "
               "see: the repository's notes on it and the SGLang issues and PRs its findings "
               "cite (sglang#N: github.com/sgl-project/sglang/pull/N or /issues/N)")


def _see(prop: str) -> List[str]:
    """Where to read about a property, all of it openable: its recorded
    findings' pages (notes/findings/), the SGLang numbers they cite, and
    the verdict table."""
    import re
    from reqmodel import findings
    mine = [f for f in findings.load() if f.property == prop]
    numbers = sorted({int(n) for f in mine for u in f.upstream
                      for n in re.findall(r"(?<![\w/])#(\d{4,6})\b", u)})
    graph = props_mod.CATALOG[prop].kind.on_graph
    return ([f"notes/findings/{f.id}.md" for f in mine]
            + [f"sglang#{n}" for n in numbers] + ["notes/verdicts.md"]
            + (["notes/liveness.md"] if graph else []))


@cli.command("releases")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON object: per release, the implementation at each guard point.")
def releases_cmd(as_json) -> None:
    """Show which implementation each release uses at every guard point."""
    impl = {r.name: {gp: getattr(r, gp).__name__.replace(gp + "_", "")
                     for gp in props_mod.g.GUARD_POINTS} for r in rel_mod.RELEASES.values()}
    if as_json:
        click.echo(json.dumps(impl, indent=1))
        return
    table = Table()
    table.add_column("guard point")
    for name in impl:
        table.add_column(name)
    for gp in props_mod.g.GUARD_POINTS:  # names
        table.add_row(gp, *[impl[name][gp] for name in impl])
    _console().print(table)


@cli.command("conform")
@click.option("--release", "release", default="all", show_default=True,
              shell_complete=_complete_release,
              help="The SGLang release whose code runs: a release, a list, or 'all'.")
@click.option("--model-release", "model_release", default=None,
              help="Predict with this release's model instead of the same release's "
                   "(the check must then report mismatches where behaviour differs).")
@click.option("--setup", "do_setup", is_flag=True,
              help="Create or complete the conformance environment (idempotent), then stop.")
@click.option("--dir", "root", type=click.Path(file_okay=False), default=None,
              help="The conformance environment (default .conform, or REQMODEL_CONFORM_DIR).")
@click.option("--cases", "target", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Model-generated cases per release, at least.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--show", "show", type=click.IntRange(min=0), default=5, show_default=True,
              help="Mismatches printed per release, side by side.")
@click.option("--trace", "trace_files", multiple=True, type=click.Path(dir_okay=False),
              help="Replay this whole counterexample (ITF) on one set of real objects, step "
                   "by step; repeatable. Runs on the trace's own release unless --release "
                   "is given.")
@click.pass_context
def conform_cmd(ctx, release, model_release, do_setup, root, target, as_json, show,
                trace_files) -> None:
    """Replay the model's seam steps against the real released SGLang code.

    Cases are the model's own transitions at the doors and at intake (every
    reachable state of the built-in scenarios, plus walks on drawn scenarios);
    each runs on the real code of the release, and the observable effects are
    compared with the model's prediction. Exit status 1 when any mismatch."""
    from reqmodel import conform
    root_path = pathlib.Path(root) if root else conform.DEFAULT_DIR
    rels = rel_mod.resolve(release)
    model = rel_mod.get(model_release) if model_release else None
    if do_setup:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=not sys.stderr.isatty()) as bar:
            task = bar.add_task("conformance environment", total=None)
            conform.setup(root_path, [r.name for r in rels],
                          step=lambda msg: bar.update(task, description=msg))
        click.echo(f"conformance environment ready in {root_path} for "
                   f"{', '.join(r.name for r in rels)}")
        return
    if trace_files:
        explicit = (ctx.get_parameter_source("release")
                    is not click.core.ParameterSource.DEFAULT)
        _conform_traces(root_path, list(trace_files), rels if explicit else [None], as_json)
        return
    outcomes = []
    for rel in rels:
        outcomes.append(conform.run(root_path, rel, model or rel, target))
    if as_json:
        click.echo(json.dumps({"results": [o.as_json() for o in outcomes]}, indent=1))
    else:
        console = _console()
        table = Table(title="conformance: model prediction vs real code")
        for col in ("release (code)", "model", "scenarios", "mismatches", "seconds"):
            table.add_column(col)
        for o in outcomes:
            table.add_row(o.release, o.model_release, f"{o.scenarios:,}",
                          f"[bold red]{len(o.mismatches)}[/]" if o.mismatches else "[green]0[/]",
                          f"{o.seconds:.1f}")
        console.print(table)
        for o in outcomes:
            for m in o.mismatches[:show]:
                console.print(f"[bold]{o.release}[/] vs model {o.model_release}: {m.seam} "
                              f"from {escape(str(m.origin))}")
                console.print(f"  inputs {json.dumps(m.inputs, sort_keys=True)}", markup=False,
                              highlight=False)
                keys = sorted(set(m.model) | set(m.real))
                side = Table(show_header=True, box=None, padding=(0, 2))
                side.add_column("observable")
                side.add_column("model")
                side.add_column("real code")
                for k in keys:
                    mv, rv = m.model.get(k), m.real.get(k)
                    style = "" if mv == rv else "[bold red]"
                    side.add_row(k, f"{style}{mv}", f"{style}{rv}")
                console.print(side)
    if any(o.mismatches for o in outcomes):
        sys.exit(1)


def _conform_traces(root, paths, rels, as_json) -> None:
    from reqmodel.conform import traces
    if rels == [None]:  # each trace on the release it names: a real one
        from reqmodel.traces import itf
        for path in paths:
            meta, _ = itf.read(path)
            name = meta.get("release")
            if meta.get("guards"):
                raise UserError(
                    f"{path}: made on the proposal {meta['guards']} (base {meta.get('base')}), "
                    "which no SGLang release contains; pass --release to replay its steps on a "
                    "release's code")
            if name not in rel_mod.NAMES:
                raise UserError(
                    f"{path}: made on {messages.short(name)}, a deliberate change of the model "
                    "(a mutant) with no SGLang code of its own; pass --release to replay its "
                    "steps on a release's code")
    results = []
    for rel in rels:
        results.extend(traces.run(root, paths, rel))
    if as_json:
        click.echo(json.dumps({"results": [r.as_json() for r in results]}, indent=1))
        return
    console = _console()
    table = Table(title="whole traces on the real code")
    for col in ("release (code)", "trace", "steps", "agreed", "reproduced", "stopped at"):
        table.add_column(col)
    for r in results:
        d = r.divergence or {}
        where = "" if not d else (f"step {d['step']} {d.get('action') or ''} r{d.get('rid')}: "
                                  f"{d['why']}" if d.get("action") else d.get("detail", ""))
        table.add_row(r.release, escape(pathlib.Path(r.trace).name), str(r.steps),
                      str(r.replayed), "[bold red]yes[/]" if r.reproduced else "no",
                      escape(where))
    console.print(table)
    for r in results:
        d = r.divergence or {}
        if d.get("why") == "state":
            console.print(f"[bold]{r.release}[/] {escape(pathlib.Path(r.trace).name)}: step "
                          f"{d['step']} ({d['action']} r{d['rid']}) departs from the model")
            side = Table(show_header=True, box=None, padding=(0, 2))
            for col in ("observable", "model", "real code"):
                side.add_column(col)
            for k, v in d["differs"].items():
                side.add_row(k, escape(str(v["model"])), escape(str(v["real"])))
            console.print(side)
        elif d.get("detail") and d.get("why") in ("error", "cannot-step"):
            console.print(f"[bold]{r.release}[/] {escape(pathlib.Path(r.trace).name)}: step "
                          f"{d['step']}: {escape(d['detail'])}")


def main(argv: Optional[List[str]] = None) -> None:
    try:
        # proposals are user code (usercode.py); a command writes all its files or none
        with usercode.watchdog(), output.transaction():
            cli.main(args=argv, prog_name="reqmodel", standalone_mode=False)
    except usercode.Overrun as exc:  # stopped just outside a proposal's own boundary
        click.echo(f"reqmodel: {usercode.overrun_message(str(exc))}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("reqmodel: aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:  # usage errors: one line, exit 2
        click.echo(f"reqmodel: {exc.format_message()}", err=True)
        sys.exit(2)
    except _USER_ERRORS as exc:
        click.echo(f"reqmodel: {exc}", err=True)
        sys.exit(2)
    except MemoryError:
        click.echo("reqmodel: out of memory: the scenario is too large for this machine", err=True)
        sys.exit(2)
    sys.exit(0)


if __name__ == "__main__":  # pragma: no cover
    main()
