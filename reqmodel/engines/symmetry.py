"""Symmetry reduction: a canonical representative for each state.

Three identities are interchangeable in the model:

* decode pages: the actions treat page ids only as names (allocation takes
  any free pages, writes go to the ids published in the metadata);
* decode metadata slots: likewise;
* requests with the same prompt length: every action is parametric in the
  request id, and every property quantifies over all requests;
* decode ranks: every action treats the ranks alike, and every property
  quantifies over all of them;
* prefill ranks: likewise (each has its own KV manager, transfer worker and
  slice of every decode page; the scheduler MIN-reduces their polls).

Requests that share a ``bootstrap_room`` are each in a class of their own
(``explore.symmetry_classes``), so a permutation never moves them, and the
rooms, keyed by their first user, move with the requests that own them.

``canonical(s)`` applies a permutation of each kind chosen from the state's
own content, so it maps a state to an isomorphic state; every state the
checker stores is a real state of the model, and properties (symmetric by
construction) give the same verdict on both.  Requests whose signatures tie
are tried in every order, and ranks in every relabelling, and the least
candidate by ``repr`` is kept, so the choice depends only on the orbit and a
stored representative is its own canonical form: the explorer looks a
successor up before canonicalising it (were a form ever not a fixed point,
that lookup would still map a state to an isomorphic one: another count, never
unsoundness).  ``ReprKey`` gives the same ``repr`` from memoised parts.  See
notes/design.md.
"""
from __future__ import annotations

import itertools
import operator
from typing import Dict, List, Optional, Sequence, Tuple

import attrs

from reqmodel.model.state import (D_TO_P, DecodeReq, DRoom, MetaSlot, Msg, P_TO_D, Page,
                                  PrefillReq, replace, Room, State)

RANKED = D_TO_P + ("ack",)  # messages whose rank field names a decode rank
DEST = ("metadata", "write", "stray")  # messages whose pages and slot name decode's pages and slots


def _rename_rid(x, pi: Sequence[int]):
    return None if x is None else pi[x]


def _rename_checksum(c, pi):
    if c is None or not c or not isinstance(c[0], int):
        return c
    return (pi[c[0]],) + tuple(c[1:])


def _request_signature(s: State, r: int) -> Tuple:
    """What request r looks like without naming other requests, pages or slots."""
    d = s.d[r]
    rooms = s.rooms_of_slot(r)
    pages = tuple(tuple((w == r, w is None) for w in s.d_pages[p].writers) for p in d.pages)
    dst = tuple(None if room.dst is None else tuple(
        (s.d_pages[p].owner == r, tuple(w == r for w in s.d_pages[p].writers)) for p in room.dst)
        for room in rooms)
    msgs = tuple((m.kind, m.pages if m.kind == "chunk" else len(m.pages), m.last,
                  m.poll, m.rank, m.gen, m.prank) for m in s.net if m.rid == r)
    tracker = s.d_rooms[r] if s.d_rooms else None
    return (
        attrs.astuple(s.p[r], recurse=False),
        replace(d, pages=(), meta_slot=-1 if d.meta_slot < 0 else 0,
                     expected_checksum=_rename_checksum(d.expected_checksum, [0] * len(s.p)),
                     outlasts=tuple(sorted((o == r, q) for o, q in d.outlasts))),
        pages,
        tuple(replace(room, dst=None, dst_slot=-1 if room.dst_slot < 0 else 0,
                      ack_to=tuple((k, g, o == r) for k, g, o in room.ack_to)) for room in rooms),
        None if tracker is None else (tuple((k, g, a == r) for k, g, a in tracker.armed),
                                      tuple((k, q, o == r) for k, q, o in tracker.acked),
                                      tracker.status,
                                      tuple((q, o == r) for q, o in tracker.responded)),
        dst, msgs, s.aborted_by_client[r],
        # the sessions listed on r's own prefill instance (per-request queues)
        tuple((q, k) for i, q, k in s.failed_sessions if i == r),
        r in s.prefill_dead, r in s.prefill_lost,
        tuple(q for i, q in s.workers_dead if i == r),
    )


class ReprKey:
    """``repr(x)`` of a state or of a nested tuple of the state's records,
    assembled from memoised reprs of the records (attrs builds a record's
    repr field by field in Python; a million states share a few thousand
    records).  The string is exactly ``repr(x)`` (tests/test_explore.py), so
    the order states are compared in, and so every stored representative, is
    the one ``repr`` gives."""

    def __init__(self) -> None:
        self.memo: Dict[object, str] = {}

    def __call__(self, x) -> str:
        if type(x) is tuple:
            if len(x) == 1:
                return "(" + self(x[0]) + ",)"
            return "(" + ", ".join([self(y) for y in x]) + ")"
        if type(x) is State:
            return "State(" + ", ".join([name + "=" + self(getattr(x, name))
                                         for name in _STATE_FIELDS]) + ")"
        if type(x) in _RECORDS:
            got = self.memo.get(x)
            if got is None:
                got = self.memo[x] = repr(x)
            return got
        return repr(x)


_STATE_FIELDS = tuple(f.name for f in attrs.fields(State))
_RECORDS = {PrefillReq, DecodeReq, Room, DRoom, Page, MetaSlot, Msg}


def canonical(s: State, classes: Tuple, ranks: int = 1, pranks: int = 1,
              key=repr, memo: Optional["FormMemo"] = None) -> State:
    """The representative of ``s``'s orbit under request, page and slot
    permutations (``_canonical``) and, with several decode (or prefill)
    ranks, under permutations of those ranks: the least (by ``repr``) of the
    canonical forms of every rank relabelling.  Rank relabelling commutes
    with the other permutations (they act on different fields), so this is
    again a true canonical form.  ``key`` is the ``repr`` to order by (a
    ``ReprKey`` shared across calls is the fast one); ``memo`` a
    ``FormMemo`` shared across calls."""
    best = _canonical(s, classes, key, memo)
    if ranks < 2 and pranks < 2:
        return best
    relabel = permute_ranks if ranks >= 2 else permute_prefill_ranks
    for perm in itertools.permutations(range(max(ranks, pranks))):
        if list(perm) == list(range(len(perm))):
            continue
        cand = _canonical(relabel(s, perm), classes, key, memo)
        if repr_less(cand, best, key):
            best = cand
    return best


def repr_less(a: State, b: State, key=repr) -> bool:
    """``key(a) < key(b)``, the order of the states' ``repr``, without
    building either string whole: field by field, skipping the fields the
    two share.  Every field is a tuple, whose ``repr`` has balanced
    parentheses, so neither of two different field strings is a prefix of
    the other and the first field that differs decides the whole string's
    order (tests/test_explore.py checks it against the strings)."""
    for name in _STATE_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x is y or x == y:
            continue
        kx, ky = key(x), key(y)
        if kx != ky:
            return kx < ky
    return False


def permute_prefill_ranks(s: State, perm: Sequence[int]) -> State:
    """Rename prefill rank q to ``perm[q]`` everywhere one is named: each
    room's per-rank entries, each page's slices, decode's response and ack
    trackers, and the messages (re-sorted: each channel keeps its order)."""
    n = s.prefill_ranks
    inv = [0] * n
    for old, new in enumerate(perm):
        inv[new] = old
    rooms = tuple(s.rooms[slot * n + inv[q]] for slot in range(len(s.rooms) // n)
                  for q in range(n))

    def page(pg: Page) -> Page:
        w = pg.writers
        moved = tuple(w[inv[q]] for q in range(n))
        return Page(pg.owner, moved[0], moved[1:])
    d_rooms = tuple(replace(t, acked=tuple(sorted((k, perm[q], o) for k, q, o in t.acked)),
                            responded=tuple(sorted((perm[q], o) for q, o in t.responded)))
                    for t in s.d_rooms)
    net = _channel_order(s, [replace(m, prank=perm[m.prank]) for m in s.net])
    failed = tuple(sorted((i, perm[q], k) for i, q, k in s.failed_sessions))
    d = tuple(replace(x, outlasts=tuple(sorted((o, perm[q]) for o, q in x.outlasts)))
              if x.outlasts else x for x in s.d)
    return replace(s, d=d, rooms=rooms, d_pages=tuple(page(pg) for pg in s.d_pages),
                   d_rooms=d_rooms, net=net, failed_sessions=failed)


def permute_ranks(s: State, perm: Sequence[int]) -> State:
    """Rename decode rank k to ``perm[k]`` everywhere a rank is named: each
    request's per-rank ABORT/ACK state and release, each room's ack targets and peers,
    and the messages (re-sorted: each channel keeps its order)."""
    def ks(xs):
        return tuple(sorted(perm[k] for k in xs))

    def first(xs):
        return tuple(sorted((perm[x[0]],) + tuple(x[1:]) for x in xs))
    d = tuple(replace(x, notified=ks(x.notified), held=ks(x.held),
                      released_on=ks(x.released_on), split=ks(x.split)) for x in s.d)
    rooms = tuple(replace(rm, ack_to=first(rm.ack_to), peers=ks(rm.peers)) for rm in s.rooms)
    d_rooms = tuple(replace(t, armed=first(t.armed), acked=first(t.acked)) for t in s.d_rooms)
    # ranks are permuted only with one prefill rank (scenario: not both above 1)
    net = _channel_order(s, [replace(m, rank=perm[m.rank]) if m.kind in RANKED else m
                             for m in s.net])
    failed = tuple(sorted((i, q, perm[k]) for i, q, k in s.failed_sessions))
    return replace(s, d=d, rooms=rooms, net=net, d_rooms=d_rooms, failed_sessions=failed)


def _canonical(s: State, classes: Tuple, key=repr, memo: Optional["FormMemo"] = None) -> State:
    """The representative of ``s``'s orbit.  ``classes[r]`` is request r's
    symmetry class (its prompt length): only requests of one class permute.

    Requests are ordered by a signature that names no other request, page or
    slot; requests whose signatures tie are tried in every order and the least
    resulting state (by ``repr``) is kept, so the result does not depend on
    how the state was labelled: a true canonical form.
    """
    n = len(s.p)
    if len(set(classes)) == n:
        if memo is not None:
            return memo(s, key)
        return _relabel_pages_slots(canonical_net_order(s), key)
    s = canonical_net_order(s)
    sigs = [key(_request_signature(s, r)) for r in range(n)]
    positions: Dict[int, List[int]] = {}
    for r in range(n):
        positions.setdefault(classes[r], []).append(r)
    # per class: members sorted by signature, grouped into ties
    per_class = []
    for cls, pos in positions.items():
        members = sorted(pos, key=lambda r: sigs[r])
        groups: List[List[int]] = []
        for r in members:
            if groups and sigs[groups[-1][0]] == sigs[r]:
                groups[-1].append(r)
            else:
                groups.append([r])
        per_class.append((pos, groups))
    options = [[]]
    for pos, groups in per_class:
        orders = [[]]
        for grp in groups:
            perms = list(itertools.permutations(grp)) if len(grp) > 1 else [tuple(grp)]
            orders = [o + list(p) for o in orders for p in perms]
        options = [opt + [(pos, o)] for opt in options for o in orders]
    best = None
    for opt in options:
        pi = [0] * n
        for pos, order in opt:
            for new_pos, old in zip(pos, order):
                pi[old] = new_pos
        cand = s if pi == list(range(n)) else _permute_requests(s, pi)
        cand = _relabel_pages_slots(cand, key)
        if len(options) == 1:
            return cand
        if best is None or repr_less(cand, best, key):
            best = cand
    return best


_MISSING = object()


class FormMemo:
    """The canonical form without request permutations, memoised on what it
    reads.  With every request in a class of its own the form is the
    channel order of the messages and the relabelling of pages and slots
    (``_relabel_pages_slots``): a function of six fields (the decode
    requests, the rooms, the messages, the pages, the slots and the room
    slots) that changes only the first five.  A step that changes none of
    them (on the prefill side, a client's flag, decode's trackers), or that
    leads where another state's step led, finds the form here: 90 % of the
    look-ups on optimistic-abort-unit, 72 % on retract-late-write
    (notes/performance.md).  Bounded: emptied when it holds ``limit``
    entries."""

    FIELDS = ("d", "rooms", "net", "d_pages", "d_slots")  # what the form changes
    KEY = FIELDS + ("room_slots",)  # what it reads
    _fields = operator.attrgetter(*FIELDS)
    _key = operator.attrgetter(*KEY)

    def __init__(self, limit: int = 1 << 16) -> None:
        self.memo: Dict[tuple, Optional[tuple]] = {}  # None: the state is its own form
        self.limit = limit

    def __call__(self, s: State, key=repr) -> State:
        k = self._key(s)
        memo = self.memo
        got = memo.get(k, _MISSING)
        if got is not _MISSING:
            if got is None:
                return s
            return replace(s, **dict(zip(self.FIELDS, got)))
        c = _relabel_pages_slots(canonical_net_order(s), key)
        if len(memo) >= self.limit:
            memo.clear()
        memo[k] = None if c is s else self._fields(c)
        return c


def _relabel_pages_slots(s: State, key=repr) -> State:
    # pages: by first occurrence, then unreferenced pages by content
    page_map: Dict[int, int] = {}
    for d in s.d:
        for p in d.pages:
            page_map.setdefault(p, len(page_map))
    for room in s.rooms:
        for p in room.dst or ():
            page_map.setdefault(p, len(page_map))
    for m in s.net:
        if m.kind in DEST:
            for p in m.pages:
                page_map.setdefault(p, len(page_map))
    rest = [p for p in range(len(s.d_pages)) if p not in page_map]
    rest.sort(key=lambda p: (s.d_pages[p].owner is None, s.d_pages[p].owner or 0,
                             tuple((w is None, w or 0) for w in s.d_pages[p].writers)))
    for p in rest:
        page_map[p] = len(page_map)
    # metadata slots: by first occurrence, then by content
    slot_map: Dict[int, int] = {}
    for d in s.d:
        if d.meta_slot >= 0:
            slot_map.setdefault(d.meta_slot, len(slot_map))
    for room in s.rooms:
        if room.dst_slot >= 0:
            slot_map.setdefault(room.dst_slot, len(slot_map))
    for m in s.net:
        if m.kind in DEST and m.slot >= 0:
            slot_map.setdefault(m.slot, len(slot_map))
    rest = [i for i in range(len(s.d_slots)) if i not in slot_map]
    rest.sort(key=lambda i: key(s.d_slots[i]))
    for i in rest:
        slot_map[i] = len(slot_map)
    if any(k != v for k, v in page_map.items()) or any(k != v for k, v in slot_map.items()):
        s = _relabel(s, page_map, slot_map)
    return s


def _permute_requests(s: State, pi: List[int]) -> State:
    n = len(pi)
    inv = [0] * n
    for old, new in enumerate(pi):
        inv[new] = old
    d = tuple(replace(s.d[inv[i]], expected_checksum=_rename_checksum(
        s.d[inv[i]].expected_checksum, pi),
        outlasts=tuple(sorted((pi[o], q) for o, q in s.d[inv[i]].outlasts)))
        for i in range(n))
    pages = tuple(Page(owner=_rename_rid(pg.owner, pi), writer=_rename_rid(pg.writer, pi),
                       slice_writers=tuple(_rename_rid(w, pi) for w in pg.slice_writers))
                  for pg in s.d_pages)
    meta = tuple(replace(sl, owner=_rename_rid(sl.owner, pi),
                              room=0 if sl.room == 0 else pi[sl.room - 1] + 1,
                              checksum=_rename_checksum(sl.checksum, pi)) for sl in s.d_slots)
    net = _channel_order(s, [replace(m, rid=pi[m.rid]) for m in s.net])
    # the stable sort keeps each channel's order; re-sort is canonical
    rooms = tuple(replace(rm, ack_to=tuple(sorted((k, g, pi[o]) for k, g, o in rm.ack_to)))
                  for i in range(n) for rm in s.rooms_of_slot(inv[i]))
    d_rooms = tuple(replace(t, armed=tuple(sorted((k, g, pi[a]) for k, g, a in t.armed)),
                            acked=tuple(sorted((k, q, pi[o]) for k, q, o in t.acked)),
                            responded=tuple(sorted((q, pi[o]) for q, o in t.responded)))
                    for t in (s.d_rooms[inv[i]] for i in range(len(s.d_rooms))))
    return State(
        p=tuple(s.p[inv[i]] for i in range(n)),
        d=d,
        rooms=rooms,
        d_pages=pages,
        d_slots=meta,
        net=net,
        aborted_by_client=tuple(s.aborted_by_client[inv[i]] for i in range(n)),
        d_rooms=d_rooms,
        room_slots=s.room_slots,
        failed_sessions=tuple(sorted((-1 if i < 0 else pi[i], q, k)
                                     for i, q, k in s.failed_sessions)),
        prefill_dead=tuple(sorted(-1 if i < 0 else pi[i] for i in s.prefill_dead)),
        prefill_lost=tuple(sorted(-1 if i < 0 else pi[i] for i in s.prefill_lost)),
        workers_dead=tuple(sorted((-1 if i < 0 else pi[i], q) for i, q in s.workers_dead)),
    )


def _relabel(s: State, page_map: Dict[int, int], slot_map: Dict[int, int]) -> State:
    pages: List[Optional[Page]] = [None] * len(s.d_pages)
    for old, new in page_map.items():
        pages[new] = s.d_pages[old]
    slots = [None] * len(s.d_slots)
    for old, new in slot_map.items():
        slots[new] = s.d_slots[old]
    d = tuple(replace(x, pages=tuple(page_map[p] for p in x.pages),
                           meta_slot=slot_map[x.meta_slot] if x.meta_slot >= 0 else -1)
              for x in s.d)
    rooms = tuple(replace(rm, dst=None if rm.dst is None else tuple(page_map[p] for p in rm.dst),
                               dst_slot=slot_map[rm.dst_slot] if rm.dst_slot >= 0 else -1)
                  for rm in s.rooms)
    net = tuple(replace(m, pages=tuple(page_map[p] for p in m.pages),
                             slot=slot_map[m.slot] if m.slot >= 0 else -1)
                if m.kind in DEST else m for m in s.net)
    return replace(s, d=d, rooms=rooms, d_pages=tuple(pages), d_slots=tuple(slots), net=net)


def _channel_order(s: State, net) -> Tuple[Msg, ...]:
    """The messages ``net`` (in flight in that order) sorted by channel: one
    normal form for every interleaving of the channels that gives the same
    sequence on each.  A stable sort on a per-message key keeps each FIFO
    channel's order and orders the channels:
    - decode->prefill, per (decode rank, prefill rank), metadata and abort,
      whatever the room;
    - prefill->decode, per prefill rank: a status report goes to every decode
      rank, so it stays where it is among its rank's messages, while the acks
      between two reports, to different decode ranks, commute and are sorted
      by decode rank (``transport.p_to_d_heads``);
    - a prefill rank's transfer queue: chunks, whatever the room
      (``transfer._chunk_next``);
    - a room's writes in flight and strays, each kind apart.
    Requests that share a room share its channels (``State.room_slots`` is
    fixed by every permutation)."""
    reports: Dict[int, int] = {}  # prefill rank -> reports before this message
    keys = []
    for m in net:
        if m.kind in D_TO_P:
            keys.append((-1, "d2p", m.rank, m.prank))
        elif m.kind in P_TO_D:
            seen = reports.get(m.prank, 0)
            if m.kind == "status":
                keys.append((-1, "p2d", m.prank, seen, 1, 0))
                reports[m.prank] = seen + 1
            else:
                keys.append((-1, "p2d", m.prank, seen, 0, m.rank))
        elif m.kind == "chunk":
            keys.append((-1, "chunk", 0, m.prank))
        else:
            keys.append((s.room_slot(m.rid), m.kind, m.rank, m.prank))
    order = sorted(range(len(net)), key=keys.__getitem__)
    return tuple(net[i] for i in order)


def canonical_net_order(s: State) -> State:
    """Messages of different channels commute; keep each channel's order."""
    net = _channel_order(s, s.net)
    return s if net == s.net else replace(s, net=net)
