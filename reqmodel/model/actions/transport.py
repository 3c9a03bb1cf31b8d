"""Messages in flight: putting a message on the network and taking it off,
the decode->prefill FIFO channels (one per room, decode rank and prefill
rank: ``send_metadata`` and ``receiver.abort`` share one cached ZMQ
connection per bootstrap endpoint, cc 21:1962-1967, 2050-2062), and the
rank and channel choices of the actions that name one.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

import functools
from typing import Iterable, List, Optional, Tuple

from reqmodel.model.actions.core import Ctx
from reqmodel.model.state import D_TO_P, Msg, replace, State


def send(s: State, msg: Msg) -> State:
    return replace(s, net=s.net + (msg,))


def consume(s: State, msg: Msg) -> State:
    i = s.net.index(msg)
    return replace(s, net=s.net[:i] + s.net[i + 1:])


def next_d_to_p(c: Ctx, s: State, r: int, rank: int = 0, q: int = 0) -> Optional[Msg]:
    """The oldest decode->prefill message of r's room from decode rank ``rank``
    to prefill rank ``q``, if request r sent it: ``send_metadata`` and
    ``receiver.abort`` share the cached socket to that bootstrap endpoint, so
    they arrive in order."""
    k = s.room_slot(r)
    for m in s.net:
        if m.kind in D_TO_P and m.rank == rank and m.prank == q and s.room_slot(m.rid) == k:
            return m if m.rid == r else None
    return None


def rank_of(arg: Tuple) -> int:
    """The decode rank a step names; a one-rank scenario leaves it out."""
    return arg[0] if arg else 0


def prank_of(arg: Tuple, i: int = 0) -> int:
    """The prefill rank a step names at position i; one prefill rank: left out."""
    return arg[i] if len(arg) > i else 0


def rank_args(c: Ctx, ranks: Iterable[int]) -> Tuple[Tuple, ...]:
    ranks = tuple(ranks)
    if c.scenario.decode.ranks == 1:
        return ((),) if 0 in ranks else ()
    return tuple((k,) for k in ranks)


def prank_args(c: Ctx, qs: Iterable[int]) -> Tuple[Tuple, ...]:
    qs = tuple(qs)
    if c.scenario.prefill.ranks == 1:
        return ((),) if 0 in qs else ()
    return tuple((q,) for q in qs)


def channel_args(c: Ctx, chans: Iterable[Tuple[int, int]]) -> Tuple[Tuple, ...]:
    """Step arguments naming (decode rank, prefill rank) pairs, trailing
    defaults left out: ``(k,)`` with several decode ranks, ``(0, q)`` with
    several prefill ranks, ``()`` with one of each."""
    chans = tuple(chans)
    if c.scenario.prefill.ranks > 1:
        return chans
    return rank_args(c, (k for k, _ in chans))


def channels(c: Ctx) -> Tuple[Tuple[int, int], ...]:
    """The (decode rank, prefill rank) pairs that talk: every pair (one side
    has a single rank), each a bootstrap connection of the receiver
    (``bootstrap_infos``)."""
    return _pairs(c.scenario.decode.ranks, c.scenario.prefill.ranks)


@functools.lru_cache(maxsize=None)
def _pairs(ranks: int, pranks: int) -> Tuple[Tuple[int, int], ...]:
    return tuple((k, q) for k in range(ranks) for q in range(pranks))


def d_to_p_channels(c: Ctx, s: State, r: int, kind: str) -> Tuple[Tuple[int, int], ...]:
    if not s.net:
        return ()
    return tuple((k, q) for k, q in channels(c)
                 if (m := next_d_to_p(c, s, r, k, q)) is not None and m.kind == kind)


def rank_msgs(s: State, kind: str, r: int, q: int) -> Tuple[Msg, ...]:
    """Messages of one kind on r's room from (or to) prefill rank q, oldest first."""
    return tuple(m for m in s.room_msgs(kind, r) if m.prank == q)


def own_ranks(s: State, kind: str, r: int) -> List[int]:
    """The prefill ranks with a message of one kind of request r's own in flight."""
    return sorted({m.prank for m in s.msgs(kind, r)})


def own_msg(s: State, kind: str, r: int, q: int) -> Msg:
    """Request r's oldest message of one kind from prefill rank q."""
    return next(m for m in s.msgs(kind, r) if m.prank == q)


def arrival_of(kind: str):
    """The guard and choices of a prefill action that takes the next
    decode->prefill message of ``kind`` off one of its FIFO channels: enabled
    when some channel has one, one choice per such channel."""
    def arrived(c, s, r) -> bool:
        return bool(d_to_p_channels(c, s, r, kind))

    def arrival_channels(c, s, r):
        return channel_args(c, d_to_p_channels(c, s, r, kind))

    arrived.__name__, arrival_channels.__name__ = f"_{kind}_arrived", f"_{kind}_channels"
    return arrived, arrival_channels
