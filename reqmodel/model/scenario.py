"""Scenarios: the model's configuration (bounds, options, enabled events).

A scenario is to the model what a TLA+ ``.cfg`` is to a spec: the same
actions run on small and large instances.  Scenarios load from TOML files
(``--scenario-file``) or by name from the built-in set in
``reqmodel/scenarios/*.toml``.  Unknown keys, wrong types and bounds that do
not fit the machine are refused with a one-line :class:`ScenarioError`.
"""
from __future__ import annotations

import math
import tomllib
from importlib import resources
from typing import Any, Dict, Optional, Tuple

import attrs

from reqmodel import messages
from reqmodel.model import releases, textfile
from reqmodel.model.clocks import TIMEOUT_ENVS


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message is one line for the user."""


# Hard bounds: beyond these the exhaustive search does not fit in 4 GB
# (see notes/performance.md for the measurements behind them).
MAX_REQUESTS = 4
MAX_POOL_PAGES = 8
MAX_PROMPT_PAGES = 8
MAX_DECODE_RANKS = 2  # each rank adds a control channel per request
MAX_PREFILL_RANKS = 2  # each rank adds a KV manager, a transfer worker and a page slice


@attrs.frozen
class Bounds:
    """What a scenario file may ask for.  The exhaustive checker enumerates
    the state space and needs the tight bounds; the Hypothesis engine and
    trace replay only ever hold one state, so they accept larger scenarios,
    up to sanity caps."""

    requests: int
    pool_pages: int
    prompt_pages: int
    decode_ranks: int
    prefill_ranks: int
    purpose: str


EXHAUSTIVE = Bounds(MAX_REQUESTS, MAX_POOL_PAGES, MAX_PROMPT_PAGES, MAX_DECODE_RANKS,
                    MAX_PREFILL_RANKS, "the exhaustive checker")
SAMPLED = Bounds(16, 64, 64, 8, 8, "the Hypothesis engine and replay")


@attrs.frozen
class Worker:
    pool_pages: int
    intake_limit_pages: int
    auto_truncate: bool = False
    kv_checksum: bool = False
    metadata_buffers: int = 4
    chunk_pages: int = 0  # chunked prefill size in pages; 0 = unchunked (P only)
    radix_cache: bool = False  # D only
    # attention-TP ranks.  Decode ranks share one prefill rank, or one decode
    # rank receives from several prefill ranks (required_prefill_response_num
    # = prefill ranks, cc 19:718-720); both above 1 is not modelled
    ranks: int = 1
    # the overlap scheduler (SGLang's default; off with
    # --disable-overlap-schedule on this worker's server).  Decode: with it,
    # pause_generation(mode="retract") processes the last batch's result
    # first, so a pending abort is promoted before the retract (sch
    # 19:5132-5135 ... 23:5833-5841).  Prefill is modelled with it only
    overlap_schedule: bool = True

    def rejects(self, prompt_pages: int) -> bool:
        """This worker's intake rejects the prompt (``validate_input_length``
        fails and ``--allow-auto-truncate`` is off)."""
        return prompt_pages > self.intake_limit_pages and not self.auto_truncate


@attrs.frozen
class Events:
    """Which nondeterministic events the search may insert.  Each is off,
    on for every request, or on for the listed request indices."""

    client_abort: Tuple[int, ...] = ()
    retract: Tuple[int, ...] = ()
    preempt: Tuple[int, ...] = ()
    transfer_failure: Tuple[int, ...] = ()
    timeouts: Tuple[int, ...] = ()
    # SGLANG_REQ_WAITING_TIMEOUT is set (off by default) and may expire for
    # these requests: the scheduler aborts a request that waited too long in
    # its waiting queue, on that worker only
    req_waiting_timeout: Tuple[int, ...] = ()
    # the prefill instance that serves these requests may die (its processes
    # stop: a killed or crashed server, a lost node); with shared transfer
    # queues the one instance serves every request
    prefill_dies: Tuple[int, ...] = ()
    # decode's heartbeat to the prefill instance of these requests may fail
    # while that instance runs on (its bootstrap server's /health does not
    # answer in time twice in a row): decode declares it lost
    prefill_silent: Tuple[int, ...] = ()
    # the transfer worker that takes these requests' chunks may raise while
    # handling one of them (a bug or a bad registration in its loop): its
    # thread ends, the rest of the prefill instance runs on
    transfer_worker_dies: Tuple[int, ...] = ()

    def on(self, name: str, rid: int) -> bool:
        return rid in getattr(self, name)

    def any(self, name: str) -> bool:
        return bool(getattr(self, name))


@attrs.frozen
class Scenario:
    name: str
    prompt_pages: Tuple[int, ...]
    prefill: Worker
    decode: Worker
    optimistic_prefill_attempts: int = 0
    deferred_release: Optional[bool] = None  # None: the release's own default
    # SGLANG_ENABLE_FAILED_SESSION_PROBE on prefill: a probe thread takes a
    # decode session off Mooncake's failed list once it answers (None: the
    # release's own default, off up to 0.5.22, on in 0.5.23)
    failed_session_probe: Optional[bool] = None
    # the deployment's timeout settings that differ from their defaults, by
    # environment variable, in seconds (``model.clocks``: which timeout can
    # pass before which)
    timeouts: Tuple[Tuple[str, float], ...] = ()
    layouts_match: bool = True
    sessions: bool = False  # every request streams in a conversation (owns a slot)
    hybrid_mamba: bool = False  # the model keeps Mamba state beside KV
    # "loop": prefill results are processed in the overlap event loop's order
    # (pf 19:599-640); "any": results may arrive at any time, as in the
    # reference's unit-level executions S5/S6 (see notes/verdicts.md)
    result_timing: str = "loop"
    events: Events = Events()
    description: str = ""
    # bootstrap_room label of each request; requests with the same label share
    # one room (the client chose it and reuses it).  () = every request its own
    bootstrap_rooms: Tuple[int, ...] = ()
    # when the client sends the next request of a shared room: once the
    # previous one has its answer from "both" workers (a router that gathers
    # both responses), or from "decode" alone (the client stops waiting once
    # the generated text is in)
    reuse_room_after: str = "both"
    # whether the users of a shared room take turns ("sequential": the next
    # user is sent once the previous one has its answer, ``reuse_room_after``)
    # or may be in flight at once ("concurrent": n > 1 parallel sampling,
    # whose samples all carry their prompt's room, tm 19:1889-1891 …
    # 23:2165-2167, or clients and routers that hand two requests one room)
    room_users: str = "sequential"
    # which Mooncake transfer queue carries a request's chunks on a prefill
    # rank: "shared", one queue and worker thread for every request (one
    # prefill scheduler sending to one decode instance: every room names the
    # same destination sessions, and the queue is chosen by them, mc
    # 19:2243-2248); "per-request", each request's own (requests prefilled by
    # different prefill instances or DP ranks, each with its own KV manager,
    # into one decode instance)
    transfer_queues: str = "shared"
    # which workers' tokenizer managers see the client's abort: "both" (a
    # router that closes both legs when the client goes), or one of them
    # (a router or gateway that keeps the other leg, or a client that calls
    # /abort_request on one server).  Prefill's sender.abort() tells decode
    # nothing (cc 19:1350-1356, 23:2458-2468)
    client_abort_reaches: str = "both"

    @property
    def n(self) -> int:
        return len(self.prompt_pages)

    def room_slot(self, r: int) -> int:
        """The index the model keys request r's room by: the first request
        that uses the same ``bootstrap_room``."""
        if not self.bootstrap_rooms:
            return r
        return self.bootstrap_rooms.index(self.bootstrap_rooms[r])

    def room_id(self, r: int) -> int:
        """Request r's ``bootstrap_room`` value (0 means "not ready" on decode)."""
        return self.room_slot(r) + 1

    def room_sharers(self, r: int) -> Tuple[int, ...]:
        """Every request that uses request r's room, in arrival order."""
        slot = self.room_slot(r)
        return tuple(i for i in range(self.n) if self.room_slot(i) == slot)

    def previous_user(self, r: int) -> Optional[int]:
        """The request that used r's room just before r, if any."""
        earlier = [i for i in self.room_sharers(r) if i < r]
        return earlier[-1] if earlier else None

    @property
    def shares_rooms(self) -> bool:
        return len(set(self.bootstrap_rooms)) < len(self.bootstrap_rooms)

    def to_dict(self) -> Dict[str, Any]:
        return to_dict(self)

    def chunk(self) -> int:
        c = self.prefill.chunk_pages
        return c if c > 0 else max(self.prompt_pages)


_TOP = {"name", "description", "prompt_pages", "bootstrap_rooms", "prefill", "decode", "options", "events"}
_PREFILL = {"pool_pages", "intake_limit_pages", "auto_truncate", "kv_checksum",
            "metadata_buffers", "chunk_pages", "ranks", "overlap_schedule"}
_DECODE = {"pool_pages", "intake_limit_pages", "auto_truncate", "kv_checksum",
           "metadata_buffers", "radix_cache", "ranks", "overlap_schedule"}
_OPTIONS = {"optimistic_prefill_attempts", "deferred_release", "failed_session_probe",
            "timeouts", "layouts_match",
            "sessions", "hybrid_mamba", "result_timing", "reuse_room_after", "room_users",
            "decode_host_receive", "transfer_queues", "client_abort_reaches"}
EVENT_NAMES = tuple(f.name for f in attrs.fields(Events))
_EVENTS = set(EVENT_NAMES)


did_you_mean = messages.did_you_mean
_short = messages.short


def _check_keys(where: str, table: Dict[str, Any], allowed: set) -> None:
    unknown = sorted(set(table) - allowed, key=str)
    if unknown:
        key = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:37] + "..."
        raise ScenarioError(
            f"unknown key '{where}{key}' (allowed: {', '.join(sorted(allowed))})")


def _default_or_bool(options: Dict[str, Any], key: str) -> Optional[bool]:
    """An option that is "default" (the release's own default: None), true or false."""
    value = options.get(key, "default")
    if value == "default":
        return None
    if not isinstance(value, bool):
        raise ScenarioError(f'options.{key} must be "default", true or false, got {_short(value)}')
    return value


def _timeouts(options: Dict[str, Any]) -> Tuple[Tuple[str, float], ...]:
    """``options.timeouts``: a table of timeout settings by environment
    variable (``clocks.TIMEOUT_ENVS``), each a positive number of seconds."""
    table = options.get("timeouts", {})
    if not isinstance(table, dict):
        raise ScenarioError("options.timeouts must be a table of seconds by environment variable")
    out = []
    for env, value in table.items():
        if env not in TIMEOUT_ENVS:
            raise ScenarioError(f"options.timeouts.{_short(env)} is not a timeout the model has "
                                f"(known: {', '.join(TIMEOUT_ENVS)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ScenarioError(f"options.timeouts.{env} must be a positive number of seconds, "
                                f"got {_short(value)}")
        out.append((env, float(value)))
    return tuple(sorted(out))


def _get(where: str, table: Dict[str, Any], key: str, typ: type, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ScenarioError(f"{where}{key} must be an integer, got {_short(value)}")
    if typ is bool and not isinstance(value, bool):
        raise ScenarioError(f"{where}{key} must be true or false, got {_short(value)}")
    if typ is str and not isinstance(value, str):
        raise ScenarioError(f"{where}{key} must be a string, got {_short(value)}")
    return value


def _worker(role: str, table: Any, n_requests: int, bounds: Bounds) -> Worker:
    where = f"[{role}] "
    if not isinstance(table, dict):
        raise ScenarioError(f"[{role}] must be a table")
    _check_keys(f"{role}.", table, _PREFILL if role == "prefill" else _DECODE)
    if "pool_pages" not in table:
        raise ScenarioError(f"[{role}] pool_pages is required")
    pool = _get(where, table, "pool_pages", int, None)
    limit = _get(where, table, "intake_limit_pages", int, pool)
    w = Worker(
        pool_pages=pool,
        intake_limit_pages=limit,
        auto_truncate=_get(where, table, "auto_truncate", bool, False),
        kv_checksum=_get(where, table, "kv_checksum", bool, False),
        metadata_buffers=_get(where, table, "metadata_buffers", int, n_requests),
        chunk_pages=_get(where, table, "chunk_pages", int, 0) if role == "prefill" else 0,
        radix_cache=_get(where, table, "radix_cache", bool, False) if role == "decode" else False,
        ranks=_get(where, table, "ranks", int, 1),
        overlap_schedule=_get(where, table, "overlap_schedule", bool, True),
    )
    if role == "prefill" and not w.overlap_schedule:
        raise ScenarioError(
            "[prefill] overlap_schedule = false is not modelled: without the overlap "
            "scheduler prefill sends a middle chunk from process_prefill_chunk and requeues "
            "a yielding request at once (pf 21:1259-1269), which the model does not have")
    if not 1 <= w.pool_pages <= bounds.pool_pages:
        raise ScenarioError(f"{where}pool_pages must be 1..{bounds.pool_pages} for {bounds.purpose}, "
                            f"got {w.pool_pages}")
    if not 1 <= w.intake_limit_pages <= w.pool_pages:
        raise ScenarioError(
            f"{where}intake_limit_pages must be 1..pool_pages ({w.pool_pages}), "
            f"got {w.intake_limit_pages}")
    if not 1 <= w.metadata_buffers <= bounds.requests:
        raise ScenarioError(f"{where}metadata_buffers must be 1..{bounds.requests}")
    if w.chunk_pages < 0:
        raise ScenarioError(f"{where}chunk_pages must be >= 0")
    most = bounds.decode_ranks if role == "decode" else bounds.prefill_ranks
    if not 1 <= w.ranks <= most:
        raise ScenarioError(f"{where}ranks must be 1..{most} for {bounds.purpose}, got {w.ranks}")
    return w


def from_dict(data: Dict[str, Any], origin: str = "<scenario>",
              bounds: Bounds = EXHAUSTIVE) -> Scenario:
    """Build and validate a scenario from parsed TOML, within ``bounds``."""
    _check_keys("", data, _TOP)
    name = _get("", data, "name", str, None)
    if not name:
        raise ScenarioError("name is required")
    prompts = data.get("prompt_pages")
    if (not isinstance(prompts, list) or not prompts
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in prompts)):
        raise ScenarioError("prompt_pages must be a non-empty list of integers")
    if len(prompts) > bounds.requests:
        raise ScenarioError(
            f"prompt_pages has {len(prompts)} requests; {bounds.purpose} is bounded "
            f"to {bounds.requests} on this machine")
    if not all(1 <= p <= bounds.prompt_pages for p in prompts):
        raise ScenarioError(f"every prompt must be 1..{bounds.prompt_pages} pages for {bounds.purpose}")
    rooms = data.get("bootstrap_rooms", [])
    if (not isinstance(rooms, list)
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in rooms)):
        raise ScenarioError("bootstrap_rooms must be a list of positive integers")
    if rooms and len(rooms) != len(prompts):
        raise ScenarioError(f"bootstrap_rooms has {len(rooms)} entries for {len(prompts)} requests")
    for section in ("prefill", "decode"):
        if section not in data:
            raise ScenarioError(f"[{section}] table is required")
    prefill = _worker("prefill", data["prefill"], len(prompts), bounds)
    decode = _worker("decode", data["decode"], len(prompts), bounds)
    if prefill.ranks > 1 and decode.ranks > 1:
        raise ScenarioError(
            "[prefill] ranks and [decode] ranks cannot both be above 1: the model has one "
            "decode rank per several prefill ranks, or several decode ranks on one prefill rank")
    options = data.get("options", {})
    if not isinstance(options, dict):
        raise ScenarioError("[options] must be a table")
    _check_keys("options.", options, _OPTIONS)
    deferred = _default_or_bool(options, "deferred_release")
    probe = _default_or_bool(options, "failed_session_probe")
    timeouts = _timeouts(options)
    attempts = _get("options.", options, "optimistic_prefill_attempts", int, 0)
    if not 0 <= attempts <= 2:
        raise ScenarioError("options.optimistic_prefill_attempts must be 0..2")
    timing = _get("options.", options, "result_timing", str, "loop")
    if timing not in ("loop", "any"):
        raise ScenarioError(f'options.result_timing must be "loop" or "any", got {_short(timing)}')
    reuse_after = _get("options.", options, "reuse_room_after", str, "both")
    if reuse_after not in ("both", "decode"):
        raise ScenarioError(
            f'options.reuse_room_after must be "both" or "decode", got {_short(reuse_after)}')
    users = _get("options.", options, "room_users", str, "sequential")
    if users not in ("sequential", "concurrent"):
        raise ScenarioError(
            f'options.room_users must be "sequential" or "concurrent", got {_short(users)}')
    if users == "concurrent" and "reuse_room_after" in options:
        raise ScenarioError(
            'options.reuse_room_after applies only to room_users = "sequential" '
            "(concurrent users of a room do not wait for each other's answers)")
    queues = _get("options.", options, "transfer_queues", str, "shared")
    if queues not in ("shared", "per-request"):
        raise ScenarioError(
            f'options.transfer_queues must be "shared" or "per-request", got {_short(queues)}')
    reaches = _get("options.", options, "client_abort_reaches", str, "both")
    if reaches not in ("both", "prefill", "decode"):
        raise ScenarioError(
            f'options.client_abort_reaches must be "both", "prefill" or "decode", got {_short(reaches)}')
    if _get("options.", options, "decode_host_receive", bool, False):
        _refuse_host_receive()
    events = data.get("events", {})
    if not isinstance(events, dict):
        raise ScenarioError("[events] must be a table")
    _check_keys("events.", events, _EVENTS)
    ev = Events(**{k: _event_targets(k, events.get(k, False), len(prompts)) for k in _EVENTS})
    sc = Scenario(
        name=name,
        description=_get("", data, "description", str, ""),
        prompt_pages=tuple(prompts),
        prefill=prefill,
        decode=decode,
        optimistic_prefill_attempts=attempts,
        deferred_release=deferred,
        failed_session_probe=probe,
        timeouts=timeouts,
        layouts_match=_get("options.", options, "layouts_match", bool, True),
        sessions=_get("options.", options, "sessions", bool, False),
        hybrid_mamba=_get("options.", options, "hybrid_mamba", bool, False),
        result_timing=timing,
        events=ev,
        bootstrap_rooms=tuple(rooms),
        reuse_room_after=reuse_after,
        room_users=users,
        transfer_queues=queues,
        client_abort_reaches=reaches,
    )
    if queues == "per-request":
        # the model keeps one prefill pool and one KV manager per rank: it can
        # stand for several prefill instances only where they do not meet there
        if sc.shares_rooms:
            raise ScenarioError(
                'options.transfer_queues = "per-request" needs a bootstrap_room per request '
                "(each prefill instance has its own KV manager and room table)")
        if prefill.pool_pages < sum(sc.prompt_pages):
            raise ScenarioError(
                'options.transfer_queues = "per-request" needs [prefill] pool_pages of at least '
                f"the prompts' sum ({sum(sc.prompt_pages)}): each prefill instance has its own pool")
    return sc


def size(sc: Scenario) -> int:
    """The scenario's size, a rough measure of its product space: per request
    its prompt pages + 3, two per event target, three per request for each
    rank beyond the first. The exhaustive engine's estimate
    (``engines.estimate``), and so its size guard, read it."""
    return sum(p + 3 for p in sc.prompt_pages) + sum(
        2 * len(targets) for targets in attrs.astuple(sc.events, recurse=False)) + (
        3 * (sc.decode.ranks - 1 + sc.prefill.ranks - 1) * sc.n)


def to_dict(sc: Scenario) -> Dict[str, Any]:
    """The scenario as TOML-shaped data, the inverse of :func:`from_dict`
    (``from_dict(to_dict(sc)) == sc``): a trace carries it, so that it replays
    without the scenario's file."""
    ev = {k: list(v) for k, v in attrs.asdict(sc.events).items()}
    def worker(w, role):
        out = {"pool_pages": w.pool_pages, "intake_limit_pages": w.intake_limit_pages,
               "auto_truncate": w.auto_truncate, "kv_checksum": w.kv_checksum,
               "metadata_buffers": w.metadata_buffers}
        if role == "prefill":
            out["chunk_pages"] = w.chunk_pages
            if w.ranks != 1:
                out["ranks"] = w.ranks
        else:
            out.update(radix_cache=w.radix_cache, ranks=w.ranks)
            if not w.overlap_schedule:
                out["overlap_schedule"] = False
        return out
    return {
        "name": sc.name, "description": sc.description,
        "prompt_pages": list(sc.prompt_pages),
        **({"bootstrap_rooms": list(sc.bootstrap_rooms)} if sc.bootstrap_rooms else {}),
        "prefill": worker(sc.prefill, "prefill"), "decode": worker(sc.decode, "decode"),
        "options": {
            "optimistic_prefill_attempts": sc.optimistic_prefill_attempts,
            "deferred_release": "default" if sc.deferred_release is None else sc.deferred_release,
            **({"failed_session_probe": sc.failed_session_probe}
               if sc.failed_session_probe is not None else {}),
            **({"timeouts": dict(sc.timeouts)} if sc.timeouts else {}),
            "layouts_match": sc.layouts_match, "sessions": sc.sessions,
            "hybrid_mamba": sc.hybrid_mamba, "result_timing": sc.result_timing,
            **({"reuse_room_after": sc.reuse_room_after}
               if sc.room_users == "sequential" else {"room_users": sc.room_users}),
            **({"transfer_queues": sc.transfer_queues}
               if sc.transfer_queues != "shared" else {}),
            **({"client_abort_reaches": sc.client_abort_reaches}
               if sc.client_abort_reaches != "both" else {}),
        },
        "events": ev,
    }


def _event_targets(key: str, value: Any, n: int) -> Tuple[int, ...]:
    if isinstance(value, bool):
        return tuple(range(n)) if value else ()
    if (isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                        for i in value)):
        bad = [i for i in value if not 0 <= i < n]
        if bad:
            raise ScenarioError(f"events.{key}: request {bad[0]} does not exist (0..{n - 1})")
        return tuple(sorted(set(value)))
    raise ScenarioError(
        f"events.{key} must be true, false or a list of request indices, got {_short(value)}")


def _refuse_host_receive() -> None:
    """Decode host receive (host-staged destinations) cannot run on any
    modelled release: 0.5.19/0.5.20 have no such mode, and from 0.5.21 decode
    refuses to start unless the transfer backend's KV manager accepts host
    destinations, which no built-in backend does (the release records'
    ``host_destination_backends``, checked against the wheels by the
    conformance suite)."""
    with_mode = [r for r in releases.RELEASES.values()
                 if r.host_destination_backends is not None]
    capable = [r.name for r in with_mode if r.host_destination_backends]
    if capable:
        raise ScenarioError(
            "options.decode_host_receive: host-staged destinations are not modelled "
            f"(needed for {', '.join(capable)}, whose backends accept them)")
    without = [r.name for r in releases.RELEASES.values() if r.host_destination_backends is None]
    raise ScenarioError(
        f"options.decode_host_receive: no modelled release can run it: {', '.join(without)} "
        f"have no host receive, and {', '.join(r.name for r in with_mode)} refuse to start "
        "decode because no built-in transfer backend accepts host destinations "
        f"({with_mode[0].cites['host_receive'].split(';')[0]}); see notes/traceability.md")


def load_file(path: str, bounds: Bounds = EXHAUSTIVE) -> Scenario:
    text = textfile.read(path, "scenario", ScenarioError, "toml")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: invalid TOML: {exc}") from None
    except (RecursionError, ValueError) as exc:  # beyond what textfile checks
        raise ScenarioError(f"{path}: cannot parse: {str(exc).splitlines()[0][:120]}") from None
    try:
        return from_dict(data, origin=path, bounds=bounds)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


def builtin_names() -> Tuple[str, ...]:
    """The built-in scenarios the exhaustive engine answers (``all``)."""
    files = resources.files("reqmodel").joinpath("scenarios")
    return tuple(sorted(f.name[:-5] for f in files.iterdir() if f.name.endswith(".toml")))


def large_names() -> Tuple[str, ...]:
    """The built-in scenarios beyond the exhaustive engine's reach
    (``scenarios/large/``, the keyword ``large``): more requests, ranks or
    events than it can enumerate; the Hypothesis engine's default."""
    files = resources.files("reqmodel").joinpath("scenarios", "large")
    return tuple(sorted(f.name[:-5] for f in files.iterdir() if f.name.endswith(".toml")))


DEFAULT = "incident"


def builtin(name: str) -> Scenario:
    large = name in large_names()
    if not large and name not in builtin_names():
        known = builtin_names() + large_names()
        raise ScenarioError(f"unknown scenario {_short(name)}"
                            f"{did_you_mean(name, known)} "
                            "('reqmodel scenarios' lists the built-in ones)")
    where = ("scenarios", "large", f"{name}.toml") if large else ("scenarios", f"{name}.toml")
    text = resources.files("reqmodel").joinpath(*where).read_text()
    return from_dict(tomllib.loads(text), origin=name, bounds=SAMPLED if large else EXHAUSTIVE)


def exhaustive_refusal(sc: Scenario) -> Optional[str]:
    """Why the exhaustive engine cannot take ``sc`` (the bounds a scenario
    file is held to), or None: a large built-in scenario is loaded with the
    sampled bounds, so the exhaustive engine asks again."""
    try:
        from_dict(to_dict(sc), origin=sc.name, bounds=EXHAUSTIVE)
    except ScenarioError as exc:
        return str(exc)
    return None


def pages_needed(tokens_pages: int) -> int:
    return max(1, math.ceil(tokens_pages))


def settings_summary(sc: Scenario) -> str:
    """What a scenario sets beyond the defaults, in a few words (``reqmodel
    scenarios`` and ``show``)."""
    import json
    data = sc.to_dict()
    base = from_dict({"name": "x", "prompt_pages": list(sc.prompt_pages),
                      "prefill": {"pool_pages": sc.prefill.pool_pages},
                      "decode": {"pool_pages": sc.decode.pool_pages}},
                     bounds=SAMPLED).to_dict()
    out = [f"pools {sc.prefill.pool_pages}/{sc.decode.pool_pages} pages"]
    for table in ("prefill", "decode", "options"):
        for key, value in data[table].items():
            if key != "pool_pages" and value != base[table].get(key):
                where = "" if table == "options" else f"{table}."
                out.append(f"{where}{key}={json.dumps(value)}")
    events = [k for k, v in data["events"].items() if v]
    if events:
        out.append("events: " + ", ".join(events))
    return "; ".join(out)
