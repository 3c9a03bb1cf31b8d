"""Conformance cases from the model: every door decision the model can reach.

A *case* is one step of the model at a seam that the real code can be driven
at (``SEAMS``): the request's record before the step, the worker's
configuration, and the model's prediction of what can be observed after it.
Cases come from the model's own transitions: every reachable state of every
built-in scenario (exhaustive), plus random walks on scenarios drawn by
``hypo.scenarios()`` (Hypothesis, derandomized), deduplicated.

Pages map to tokens so that the model's page arithmetic and the code's token
arithmetic agree at every boundary (notes/conformance.md): a prompt of ``p``
pages has ``(p-1)*PAGE + 1`` tokens; a limit of ``L`` pages is
``max_req_input_len = (L-1)*PAGE + 2`` (the code rejects ``len >= limit`` and
truncates to ``limit`` tokens, which is still ``L`` pages); a pool of ``P``
pages holds ``(P-1)*PAGE + 1`` tokens (the code rejects ``len > pool``).
"""
from __future__ import annotations

import json
import random
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import attrs

from reqmodel.model import actions, processes
from reqmodel.engines import exhaustive as explore
from reqmodel.model import scenario as scenario_mod
from reqmodel.model import events as ev
from reqmodel.model.actions import ACTIONS, BY_NAME, Ctx
from reqmodel.conform import kvcases
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import DStage, KVPoll, PStage, State

PAGE = 16
# the seams issue #24 added, and the cases each must have per release
SEAMS_WITH_MINIMUM = ("decode_prealloc", "decode_commit", "status_merge", "abort_ack",
                      "deferred_release")
PER_SEAM = 100
# model action -> seam driven in the real code (adapter.SEAMS), as each
# action declares it in @action(seam=...)
SEAMS = {a.name: a.seam for a in ACTIONS if a.seam is not None}


def tokens(pages: int) -> int:
    return (pages - 1) * PAGE + 1


def limit_tokens(pages: int) -> int:
    return (pages - 1) * PAGE + 2


def pages(n_tokens: int) -> int:
    return -(-n_tokens // PAGE)


def kind(reason) -> Optional[str]:
    return None if reason is None else reason.kind


@attrs.frozen
class Case:
    seam: str
    action: str  # the model action it comes from
    inputs: str  # JSON of what the worker needs (canonical, for dedup)
    expect: str  # JSON of the model's predicted observation
    origin: str  # scenario and step that produced it, for the report

    def to_worker(self) -> dict:
        return dict(json.loads(self.inputs), seam=self.seam)


def _dump(d: dict) -> str:
    return json.dumps(d, sort_keys=True)


@attrs.frozen
class Fired:
    """One seam step, fired on request ``r`` in state ``s``: what an encoder reads."""

    ctx: Ctx
    s: State
    r: int
    worker: str  # the action's worker
    nxt: State
    evs: tuple

    def count(self, cls: type, resource: Optional[str] = None) -> int:
        """Events of request ``r`` of this class (and resource)."""
        return sum(1 for e in self.evs if e.rid == self.r and isinstance(e, cls)
                   and (resource is None or e.resource == resource))


def _finish(post) -> dict:
    return {"to_finish": kind(post.to_finish), "finished_reason": kind(post.finished_reason)}


def _intake(f: Fired):
    sc, r = f.ctx.scenario, f.r
    on_prefill = f.worker == "prefill"
    w = sc.prefill if on_prefill else sc.decode
    post = f.nxt.p[r] if on_prefill else f.nxt.d[r]
    inputs = {"req": {"tokens": tokens(sc.prompt_pages[r])},
              "limit_tokens": limit_tokens(w.intake_limit_pages),
              "auto_truncate": w.auto_truncate}
    return inputs, {"pages": post.origin_pages, **_finish(post)}


def _prefill_result(f: Fired):
    sc, pre, post = f.ctx.scenario, f.s.p[f.r], f.nxt.p[f.r]
    # the oldest result due, with something left to send (send_kv_chunk
    # is a spy: its early return when nothing is left is not driven)
    end, rest = pre.results_due[0], pre.results_due[1:]
    if pre.sent >= end:
        return None
    inputs = {"req": _req(pre, holds_kv=pre.holds_kv, holds_metadata=pre.holds_metadata,
                          retraction_backup=False, pending_bootstrap=pre.pending_bootstrap,
                          sender=pre.has_sender),
              "buffers": sc.prefill.metadata_buffers}
    if end < pre.origin_pages:  # a middle chunk
        still = pre.stage is PStage.CHUNKED or pre.origin_pages in rest
        inputs.update(middle_chunks=pre.inflight_middle_chunks, still_chunking=still,
                      end_tokens=tokens(end), attempts=sc.optimistic_prefill_attempts,
                      attempts_used=sc.optimistic_prefill_attempts - pre.requeues_left)
        # the tree-cache insert before a requeue's release is not modelled
        # (notes/conformance.md): `cached` is not compared on middle results
        expect = {"requeued": (("waiting" if post.stage is PStage.WAITING else "bootstrap")
                               if f.count(ev.Requeue) else None),
                  "pending_bootstrap": post.pending_bootstrap,
                  "is_retracted": post.is_retracted}
    elif rest:
        return None
    else:
        expect = {"cached": f.count(ev.Release, "cache")}
    return inputs, dict(
        expect, inflight=post.stage is PStage.INFLIGHT, sent=f.count(ev.Send),
        sender_aborted=int(post.concluded != pre.concluded and post.concluded is KVPoll.Failed),
        kv_released=f.count(ev.Release, "kv"), buffer_freed=_freed(pre, post),
        streamed=f.count(ev.Stream), **_finish(post))


def _prefill_inflight(f: Fired):
    ctx, s, r = f.ctx, f.s, f.r
    pre, post = s.p[r], f.nxt.p[r]
    poll = actions.kvmanager.sender_poll(ctx, s, r)
    parked_ok = (KVPoll.WaitingForInput, KVPoll.Failed)
    if (poll not in parked_ok if pre.pending_bootstrap
            else poll not in (KVPoll.Success, KVPoll.Failed)):
        return None
    if pre.pending_bootstrap and (actions.kvmanager.room_of(ctx, s, r).prefix
                                  or pre.sent >= pre.extend_end):
        return None  # a decode prefix hit, or nothing to send: not driven
    inputs = {"req": _req(pre, holds_kv=pre.holds_kv, holds_metadata=pre.holds_metadata,
                          retraction_backup=False, pending_bootstrap=pre.pending_bootstrap),
              "buffers": ctx.scenario.prefill.metadata_buffers, "poll": poll.name}
    return inputs, {
        "left_queue": post.stage is not PStage.INFLIGHT,
        "kv_released": f.count(ev.Release, "kv"), "buffer_freed": _freed(pre, post),
        "streamed": f.count(ev.Stream), "sender_init": f.count(ev.Acquire, "init"),
        "sent": f.count(ev.Send), "pending_bootstrap": post.pending_bootstrap, **_finish(post)}


def _prefill_door(f: Fired):
    sc, pre, post = f.ctx.scenario, f.s.p[f.r], f.nxt.p[f.r]
    inputs = {"req": _req(pre, holds_kv=pre.holds_kv, holds_metadata=pre.holds_metadata,
                          retraction_backup=False),
              "pool_tokens": tokens(sc.prefill.pool_pages),
              "limit_tokens": limit_tokens(sc.prefill.intake_limit_pages),
              "buffers": sc.prefill.metadata_buffers}
    return inputs, {"queued": post.stage is PStage.BOOTSTRAP, "sender": post.has_sender,
                    "retired": f.count(ev.DoorRetire), "streamed": f.count(ev.Stream),
                    **_finish(post)}


def _decode_door(f: Fired):
    sc, pre, post = f.ctx.scenario, f.s.d[f.r], f.nxt.d[f.r]
    if pre.origin_pages > sc.decode.pool_pages:
        return None  # decode's capacity check is overridden in the adapter
    inputs = {"req": _req(pre, holds_kv=pre.holds_kv, holds_metadata=False,
                          retraction_backup=pre.retraction_backup),
              "buffers": sc.decode.metadata_buffers,
              "is_retracted": pre.door_flag == "retracted",
              "is_rebootstrap": pre.door_flag == "rebootstrap"}
    return inputs, {"queued": post.stage is DStage.PREALLOC,
                    "retracted_queue": post.stage is DStage.RETRACTED,
                    "receiver": post.has_receiver, "retired": f.count(ev.DoorRetire),
                    "streamed": f.count(ev.Stream), **_finish(post)}


def _decode_commit(f: Fired):
    """D3 ``pop_transferred`` on a Success or a Failed poll, then
    ``resolve_deferred_releases`` (the model resolves a hold in the same
    step).  Driven with one decode rank (a real queue is one rank's) and
    matching layouts (0.5.23 keeps a digest it will skip at attend; the
    commit seam does not drive attend)."""
    c, s, r = f.ctx, f.s, f.r
    sc = c.scenario
    if sc.decode.ranks != 1 or not sc.layouts_match:
        return None
    pre, post = s.d[r], f.nxt.d[r]
    slot = s.d_slots[pre.meta_slot]
    room, after = actions.kvmanager.d_room_of(c, s, r), actions.kvmanager.d_room_of(c, f.nxt, r)
    latched = pre.receiver_state if pre.receiver_state in (KVPoll.Success, KVPoll.Failed) else None
    inputs = {"req": _req(pre, holds_kv=True, holds_metadata=False, retraction_backup=False),
              "status": kvcases.poll_name(room.status), "latched": kvcases.poll_name(latched),
              "slot_room": ("own" if slot.room == sc.room_id(r)
                            else "none" if slot.room == 0 else "other"),
              "slot_checksum": slot.checksum is not None,
              "checksum": c.release.checksum is not None and sc.decode.kv_checksum,
              "deferred": c.deferred, "notified": bool(pre.notified),
              "pranks": sc.prefill.ranks, "tracker": kvcases.tracker_of(room, 0),
              "buffers": sc.decode.metadata_buffers}
    aborts = sum(1 for m in f.nxt.net if m.kind == "abort" and m.rid == r) - sum(
        1 for m in s.net if m.kind == "abort" and m.rid == r)
    return inputs, {
        "transferred": post.stage is DStage.WAITING, "held": post.stage is DStage.HELD,
        "kv_released": int(bool(pre.pages) and not post.pages),
        "buffer_freed": int(pre.meta_slot >= 0 and post.meta_slot < 0),
        "streamed": f.count(ev.Stream), "receiver_cleared": after.status is None,
        "abort_sent": aborts, "armed": kvcases.tracker_of(after, 0) is not None,
        "checksum": post.expected_checksum is not None, **_finish(post)}


def gated(ctx: Ctx, s) -> Iterable[int]:
    """Requests in decode's transfer queue whose receiver polls Success while
    their metadata slot reads room 0: the metadata gate keeps them waiting
    (``decode.transfer_poll``), so ``pop_transferred`` must leave them alone."""
    for r in range(ctx.scenario.n):
        req = s.d[r]
        if (req.stage is DStage.TRANSFER and not s.halted()
                and actions.kvmanager.receiver_poll(ctx, s, r) == KVPoll.Success
                and actions.decode.transfer_poll(ctx, s, r) != KVPoll.Success):
            yield r


def held(ctx: Ctx, s) -> Iterable[int]:
    """Requests decode holds for their drain ack (on any decode rank)."""
    if s.halted():
        return ()
    return [r for r in range(ctx.scenario.n) if s.d[r].stage is DStage.HELD]


def deferred_release_cases(ctx: Ctx, s, r: int) -> Iterable[Tuple[str, Tuple[dict, dict]]]:
    """Held request r of ``s``, judged by ``resolve_deferred_releases`` on
    every decode rank at once, before its deadline (the model's
    ``resolve_held``, which ``d_recv_ack`` runs on the room's tracker as it
    is) and after it (``do_release``, ``d_deferred_timeout``).  Per rank: held,
    KV released, slot freed; the room's entry and the rank's tracker once the
    hold has ended on every rank (the model keeps one picture of the ranks'
    room records, in lockstep: a rank that lets go before the others, up to
    0.5.22, clears its own entry and tracker at once, notes/conformance.md)."""
    sc = ctx.scenario
    kvm = actions.kvmanager
    pre = s.d[r]
    room = kvm.d_room_of(ctx, s, r)
    ranks = range(sc.decode.ranks)
    inputs = {"req": _req(pre, holds_kv=True, holds_metadata=False, retraction_backup=False),
              "status": kvcases.poll_name(room.status), "held": sorted(pre.held),
              "trackers": [kvcases.tracker_of(room, k) for k in ranks],
              "pranks": sc.prefill.ranks, "buffers": sc.decode.metadata_buffers}
    for how, (nxt, _) in (("resolve", actions.drelease.resolve_held(ctx, s, r)),
                          ("timeout", actions.drelease.do_release(ctx, s, r, on_ack=False))):
        post, after = nxt.d[r], kvm.d_room_of(ctx, nxt, r)
        still = post.held if post.stage is DStage.HELD else ()
        per_rank = []
        for k in ranks:
            let_go = k in pre.held and k not in still
            got = {"held": k in still, "kv_released": int(let_go),
                   "buffer_freed": int(let_go and pre.meta_slot >= 0)}
            if not still:
                got.update(status=kvcases.poll_name(after.status),
                           tracker=kvcases.tracker_of(after, k) is not None)
            per_rank.append(got)
        yield how, (dict(inputs, expired=how == "timeout"), {"ranks": per_rank})


def prealloc_queue(ctx: Ctx, s) -> Tuple[int, ...]:
    """Decode's prealloc queue in ``s``: the requests at D2, one decode rank."""
    return tuple(r for r in range(ctx.scenario.n) if s.d[r].stage is DStage.PREALLOC)


def prealloc_cases(ctx: Ctx, s) -> Iterable[Tuple[int, Tuple[dict, dict]]]:
    """D2 ``pop_preallocated`` on decode's whole prealloc queue, once per
    request in it (that request first in the queue): whether the handshake
    raises (``d_unexpected_poll``, ``d_poll_popped_room``), which entries the
    abort scan drops (``d_prealloc_drop``), whether the first one is
    preallocated (``d_prealloc``) and the metadata it publishes.  Driven with
    one decode rank, no decode radix cache (a prefix hit needs the real tree),
    no rebootstrap in the queue, ``--num-reserved-decode-tokens 0`` and 8 new
    tokens a request (so the budget is the model's page count: a prompt of
    ``p`` pages leaves 15 tokens of its last page, notes/conformance.md)."""
    sc = ctx.scenario
    queue = prealloc_queue(ctx, s)
    # the decode loop does not call pop_preallocated while a request waits
    # retracted or while the engine is paused (processes.DECODE_LOOP
    # .returns_early): no case there
    if (sc.decode.ranks != 1 or sc.decode.radix_cache or not queue or s.halted()
            or "prealloc" in processes.skipped_phases(processes.DECODE_LOOP, s)
            or any(s.d[r].rebootstrap or not s.d[r].has_receiver for r in queue)):
        return
    kvm = actions.kvmanager
    rooms = sorted({sc.room_id(r) for r in queue})
    label = {room: str(i) for i, room in enumerate(rooms)}
    status = {label[sc.room_id(r)]: kvcases.poll_name(kvm.d_room_of(ctx, s, r).status)
              for r in queue}
    slots = [i for i, sl in enumerate(s.d_slots) if sl.owner is None]
    retracted = [tokens(s.d[r].origin_pages) for r in range(sc.n)
                 if s.d[r].stage is DStage.RETRACTED]
    crash = {"d_poll_popped_room": "KeyError", "d_unexpected_poll": "ValueError"}
    raises = sorted({kind for name, kind in crash.items() for r in queue
                     if BY_NAME[name].enabled(ctx, s, r)})
    for focus in queue:
        order = (focus,) + tuple(r for r in queue if r != focus)
        entries = []
        for r in order:
            d = s.d[r]
            latched = d.receiver_state if d.receiver_state in (KVPoll.Success, KVPoll.Failed) else None
            entries.append({"tokens": tokens(d.origin_pages), "to_finish": kind(d.to_finish),
                            "finished_reason": kind(d.finished_reason),
                            # waiting_for_input: marked by a handshake poll
                            # (where one can be skipped) or polled in this call
                            "waiting": d.receiver_state is KVPoll.WaitingForInput
                            and (d.waiting_for_input or ctx.release.handshake_polls_waiting),
                            "latched": kvcases.poll_name(latched),
                            "room": label[sc.room_id(r)]})
        inputs = {"entries": entries, "rooms": status, "pool_pages": sc.decode.pool_pages,
                  "free_pages": list(s.free_d_pages()), "free_slots": slots,
                  "buffers": sc.decode.metadata_buffers, "pranks": sc.prefill.ranks,
                  "retracted": retracted}
        if raises:  # a list of two would be two outcomes for one input
            yield focus, (inputs, {"crash": raises[0] if len(raises) == 1 else raises})
            continue
        # one call drops every finished entry (named by the first)
        drops = actions.decode._dropped(ctx, s)
        dropped = [i for i, r in enumerate(order) if r in drops]
        after, streamed = s, 0
        if drops:
            after, evs = BY_NAME["d_prealloc_drop"].effect(ctx, s, drops[0], ())
            streamed = sum(1 for e in evs if isinstance(e, ev.Stream))
        expect = {"crash": None, "dropped": dropped, "streamed": streamed,
                  "preallocated": BY_NAME["d_prealloc"].enabled(ctx, s, focus),
                  "rooms": {label[sc.room_id(r)]:
                            kvcases.poll_name(kvm.d_room_of(ctx, after, r).status)
                            for r in queue}}
        if expect["preallocated"]:
            expect["metadata"] = {"frames": len(actions.transport.channels(ctx)),
                                  "pages": s.d[focus].origin_pages, "pages_were_free": True,
                                  "slot_was_free": True, "prefix": 0}
        yield focus, (inputs, expect)


# one encoder per seam, keyed like the adapter's SEAMS (CCF's one trace
# operator per implementation event): the model's step -> the seam's inputs
# and the observable effects the real code must show
ENCODERS = {"intake": _intake, "prefill_result": _prefill_result,
            "prefill_inflight": _prefill_inflight, "prefill_door": _prefill_door,
            "decode_door": _decode_door, "decode_commit": _decode_commit}


def case_of(ctx: Ctx, s, name: str, r: int) -> Optional[Tuple[dict, dict]]:
    """(inputs, prediction) for firing ``name`` on request ``r`` in state ``s``,
    or None when the seam is not driven for it (see notes/conformance.md)."""
    a = BY_NAME[name]
    nxt, evs = a.effect(ctx, s, r, ())
    if nxt.halted():
        # the step ends where release_kv_cache's assertion raises (memc
        # 19:257-260); the adapter's release_kv_cache is a spy that does not
        # raise, and the tree cache is not this seam's (notes/conformance.md)
        return None
    return ENCODERS[a.seam](Fired(ctx, s, r, a.worker, nxt, evs))


def _freed(pre, post) -> int:
    """Metadata buffers the step freed (negative: took)."""
    return int(pre.holds_metadata) - int(post.holds_metadata)


def _req(pre, **markers) -> dict:
    return {"tokens": tokens(pre.origin_pages), "to_finish": kind(pre.to_finish),
            "finished_reason": kind(pre.finished_reason), "is_retracted": pre.is_retracted,
            **markers}


def seam_steps(ctx: Ctx, s) -> Iterable[Tuple[str, int]]:
    """The seam actions enabled in ``s``, with their requests, in registry
    order.  ``s`` is not halted (``Collector.add_state`` returned on it), and
    a guard holds only where its needs do (``Ctx.indexed``, which keeps the
    scenario's allowed pairs): what remains of ``Action.enabled`` is the
    guard (re-testing ``halted`` per candidate was a fifth of case building)."""
    for a, r in ctx.indexed(s):
        if a.seam is not None and a.guard(ctx, s, r):
            yield a.name, r


class Collector:
    """Distinct cases, keyed by (seam, inputs): the same inputs must always get
    the same prediction (a model that predicted two outcomes for one input
    would be nondeterministic where the code is not; that raises)."""

    def __init__(self, release: Release):
        self.release = release
        self.cases: Dict[Tuple[str, str], Case] = {}
        self.step_cases = 0  # cases of the action seams (ENCODERS)
        self.per_seam: Dict[str, int] = {}
        self._rooms_seen: set = set()

    def _add(self, seam: str, name: str, inputs: dict, expect: dict, origin: str) -> bool:
        key = (seam, _dump(inputs))
        case = Case(seam, name, key[1], _dump(expect), origin)
        old = self.cases.setdefault(key, case)
        if old.expect != case.expect:
            raise AssertionError(f"model predicts two outcomes for one input: "
                                 f"{old.origin} vs {case.origin}")
        if old is case:
            self.per_seam[seam] = self.per_seam.get(seam, 0) + 1
        return old is case

    def enough(self, target: int) -> bool:
        """``target`` cases of the action seams, and ``PER_SEAM`` of each seam
        issue #24 added (the walks go on until both, or their budget ends)."""
        return self.step_cases >= target and all(
            self.per_seam.get(seam, 0) >= PER_SEAM for seam in SEAMS_WITH_MINIMUM)

    def add_state(self, ctx: Ctx, s, origin: str) -> None:
        if s.halted():  # nothing runs after a crash
            return
        for name, r in seam_steps(ctx, s):
            if name == "d_transferred":
                # what the commit's case depends on: the request's record, its
                # metadata slot and room, and the configuration
                sc = ctx.scenario
                key = ("commit", sc.prefill.ranks, sc.decode, sc.layouts_match, ctx.deferred,
                       s.d[r], s.d_slots[s.d[r].meta_slot],
                       actions.kvmanager.d_room_of(ctx, s, r), sc.room_id(r))
                if key in self._rooms_seen:
                    continue
                self._rooms_seen.add(key)
            got = case_of(ctx, s, name, r)
            if got is not None and self._add(SEAMS[name], name, *got, f"{origin}, {name}(r{r})"):
                self.step_cases += 1
        for r in gated(ctx, s):
            got = _decode_commit(Fired(ctx, s, r, "decode", s, ()))
            if got is not None:
                self._add("decode_commit", "transfer_poll", *got, f"{origin}, gated r{r}")
        for r, got in prealloc_cases(ctx, s):
            self._add("decode_prealloc", "pop_preallocated", *got,
                      f"{origin}, pop_preallocated (r{r} first)")
        self._add_held(ctx, s, origin)
        # a drain ack that can arrive now is counted by the tracker before
        # the holds are judged (d_recv_ack): the holds as the ack leaves them
        for r in range(ctx.scenario.n):
            for m in actions.transport.arriving(ctx, s, "ack", r):
                s1, counted = actions.kvmanager.note_ack(
                    ctx, actions.transport.consume(s, m), r, m.rank, m.prank, m.gen)
                if counted:
                    self._add_held(ctx, s1, f"{origin}, r{r}'s ack counted")

    def _add_held(self, ctx: Ctx, s, origin: str) -> None:
        for r in held(ctx, s):
            # what the cases of a held request depend on: its record, its
            # room's, and the configuration (most states differ elsewhere)
            key = ("held", ctx.scenario.prefill.ranks, ctx.scenario.decode,
                   s.d[r], actions.kvmanager.d_room_of(ctx, s, r))
            if key in self._rooms_seen:
                continue
            self._rooms_seen.add(key)
            for how, got in deferred_release_cases(ctx, s, r):
                self._add("deferred_release", how, *got, f"{origin}, {how} r{r}")
        # the KV managers' records in this state (kvcases.py); a state whose
        # rooms were all seen under the same configuration adds nothing
        for r in kvcases.rooms(ctx, s):
            key = kvcases.room_key(ctx, s, r)
            if key in self._rooms_seen:
                continue
            self._rooms_seen.add(key)
            for seam, helper, inputs, expect in kvcases.predictions(ctx, s, r):
                self._add(seam, helper, inputs, expect,
                          f"{origin}, {helper} ({inputs['op']}, room of r{r})")


StatesOf = Callable[[str], Sequence[State]]


def reachable_states(release: Release, name: str) -> Sequence[State]:
    """Every reachable (canonical) state of a built-in scenario, breadth-first."""
    return explore.explore(release, scenario_mod.builtin(name), [], stop_early=False,
                           keep_graph=False, keep_states=True).state_of


def from_builtin(release: Release, names: Optional[List[str]] = None,
                 collector: Optional[Collector] = None,
                 states_of: Optional[StatesOf] = None) -> Collector:
    """Every reachable state of the built-in scenarios (exhaustive).
    ``states_of(name)`` may supply them from an exploration already made (the
    test suite shares its explorations); it must give every reachable state in
    breadth-first order, as ``reachable_states`` does, so that the cases and
    their origins are the same."""
    col = collector or Collector(release)
    for name in names or scenario_mod.builtin_names():
        sc = scenario_mod.builtin(name)
        states = states_of(name) if states_of else reachable_states(release, name)
        ctx = Ctx(release=release, scenario=sc)
        for s in states:
            col.add_state(ctx, s, f"scenario {name}")
    return col


def from_drawn(release: Release, target: int, collector: Optional[Collector] = None,
               max_examples: int = 8000, walk_steps: int = 60) -> Collector:
    """Random walks on scenarios drawn by ``hypo.scenarios()`` until ``target``
    distinct cases of the action seams are collected and each seam of
    ``SEAMS_WITH_MINIMUM`` has ``PER_SEAM`` (derandomized: the same cases
    every run)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from reqmodel.engines.hypothesis import engine as hypo

    col = collector or Collector(release)

    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(hypo.scenarios(), st.integers(0, 2**32 - 1))
    def walk(sc: Scenario, seed: int) -> None:
        # every draw is made before the body runs, and the run is
        # derandomized: the examples before the target is reached are the
        # same whether or not the run stops there, so it stops (drawing the
        # rest of ``max_examples`` for nothing was about 30 CPU s a release)
        if col.enough(target):
            raise _Enough
        rnd = random.Random(seed)
        ctx = Ctx(release=release, scenario=sc)
        s = actions.initial_state(sc)
        for i in range(walk_steps):
            col.add_state(ctx, s, f"drawn scenario {_describe(sc)}, step {i}")
            succ = list(actions.enabled(ctx, s))
            if not succ:
                return
            a, r = rnd.choice(succ)
            arg = next(iter(a.args(ctx, s, r)))
            s, _ = a.effect(ctx, s, r, arg)

    # without Hypothesis's injection of the literals of the modules loaded so
    # far, the drawn cases are the same whatever the process imported first
    from reqmodel.engines.hypothesis import shim
    with shim.no_constant_injection():
        try:
            walk()
        except _Enough:
            pass
    return col


class _Enough(BaseException):
    """Ends ``from_drawn``'s walks at the target.  A BaseException, not an
    Exception: Hypothesis takes an Exception for a failure and would shrink
    it; this one it lets through, as it does KeyboardInterrupt."""


def _describe(sc: Scenario) -> str:
    return (f"prompts {list(sc.prompt_pages)}, P pool {sc.prefill.pool_pages} limit "
            f"{sc.prefill.intake_limit_pages}{' truncate' if sc.prefill.auto_truncate else ''}, "
            f"D pool {sc.decode.pool_pages} limit {sc.decode.intake_limit_pages}"
            f"{' truncate' if sc.decode.auto_truncate else ''}")


ROOM_SCENARIO = "room-reuse-three"  # any scenario whose requests share a room


def room_cases(release: Release) -> List[Case]:
    """Decode's ``request_status[room]`` entry, which every receiver of a
    ``bootstrap_room`` shares (the popped-room crash and the room-reuse
    verdicts rest on it): from every prior entry (none, or each KVPoll), each
    operation the model's receiver helpers perform on it (``receiver_init``,
    a prefill report through the release's ``update_status``,
    ``receiver_clear``, ``receiver_poll`` of a receiver that has not
    concluded, where None stands for check_status's KeyError), with the
    entry the model predicts after it."""
    sc = scenario_mod.builtin(ROOM_SCENARIO)
    ctx = Ctx(release=release, scenario=sc)
    base = actions.core.set_d(actions.initial_state(sc), 0, has_receiver=True, receiver_state=None,
                         stage=DStage.TRANSFER)
    name = kvcases.poll_name
    out = []
    for prior in (None,) + tuple(KVPoll):
        s = actions.kvmanager.set_d_room(ctx, base, 0, status=prior)
        ops = [("init", {}, actions.kvmanager.receiver_init(ctx, s, 0)[1], None),
               ("clear", {}, actions.kvmanager.d_room_of(ctx, actions.kvmanager.receiver_clear(ctx, s, 0), 0).status,
                None)]
        polled = actions.kvmanager.receiver_poll(ctx, s, 0)
        ops.append(("poll", {}, prior, "KeyError" if polled is None else polled.name))
        for new in KVPoll:
            ops.append(("report", {"status": new.name}, release.update_status(prior, new), None))
        for op, extra, after, poll in ops:
            inputs = dict(op=op, prior=name(prior), **extra)
            expect = {"status": name(after)}
            if poll is not None:
                expect["poll"] = poll
            out.append(Case("decode_room", "receiver_" + op, _dump(inputs), _dump(expect),
                            f"decode room entry {name(prior)}, {op} {extra.get('status', '')}"
                            .strip()))
    return out


def model_cases(release: Release, target: int = 1000,
                states_of: Optional[StatesOf] = None) -> List[Case]:
    col = from_builtin(release, states_of=states_of)
    from_drawn(release, target, col)
    return list(col.cases.values()) + room_cases(release)
