"""Messages in flight: putting a message on the network and taking it off,
the FIFO channels, and the rank and channel choices of the actions that
name one.

The channels are the code's sockets, whatever the room:
- decode->prefill, one per (decode rank, prefill rank): ``send_metadata``
  and ``receiver.abort`` go through the receiver class's one cached PUSH
  socket per bootstrap endpoint (``_connect_to_bootstrap_server``, cc
  19:1576-1580, 21:1962-1967) from decode's scheduler thread, and prefill's
  bootstrap thread takes them off its one server socket in order;
- prefill->decode, one per (prefill rank, decode rank): a rank's status
  reports and ABORT_ACKs share its KV manager's cached socket per decode
  endpoint (``_send_multipart_locked``, cc 19:899-906, 21:1254-1260), and
  decode's ``decode_thread`` applies them as they arrive (``P_TO_D``).
Each prefill instance (or DP rank) has its own sockets: with per-request
transfer queues every request's channels are its own.
A status report goes to every decode rank of the room (one message here, so
it is the head of every one of its rank's channels at once); an ack to one.

Releases differ only through ``ctx.release``; docstrings cite the SGLang
code per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23)."""
from __future__ import annotations

import functools
from typing import Iterable, List, Optional, Tuple

from reqmodel.model.actions.core import Ctx
from reqmodel.model.state import D_TO_P, Msg, MsgKind, P_TO_D, replace, State


def send(s: State, msg: Msg) -> State:
    return replace(s, net=s.net + (msg,))


def consume(s: State, msg: Msg) -> State:
    i = s.net.index(msg)
    return replace(s, net=s.net[:i] + s.net[i + 1:])


def next_d_to_p(c: Ctx, s: State, r: int, rank: int = 0, q: int = 0) -> Optional[Msg]:
    """The oldest decode->prefill message from decode rank ``rank`` to prefill
    rank ``q`` of r's prefill instance, whatever its room, if request r sent
    it.  With per-request transfer queues each request has its own prefill
    instance (or DP rank), so its own bootstrap endpoint and channel."""
    own = c.scenario.transfer_queues != "shared"
    for m in s.net:
        if m.kind in D_TO_P and m.rank == rank and m.prank == q and (not own or m.rid == r):
            return m if m.rid == r else None
    return None


def p_to_d_heads(s: State, per_request: bool = False) -> Tuple[Msg, ...]:
    """The prefill->decode messages that can arrive next: each the oldest of
    its prefill rank on every decode rank it goes to (a status report goes to
    all of them, an ack to its ``rank``).  With ``per_request`` (transfer
    queues) each request's prefill instance has its own sockets: its
    messages are on channels of their own."""
    heads = []
    behind_all = set()  # prefill ranks with a status in flight: every channel is behind it
    behind = set()  # (prefill rank, decode rank) channels with an older message
    started = set()  # prefill ranks with any older message
    for m in s.net:
        if m.kind not in P_TO_D:
            continue
        src = (m.rid, m.prank) if per_request else m.prank
        if src in behind_all:
            continue
        if m.kind is MsgKind.status:
            if src not in started:
                heads.append(m)
            behind_all.add(src)
        else:
            if (src, m.rank) not in behind:
                heads.append(m)
            behind.add((src, m.rank))
        started.add(src)
    return tuple(heads)


def arriving(c: Ctx, s: State, kind: str, r: int) -> Tuple[Msg, ...]:
    """Request r's own messages of one prefill->decode kind that can arrive next."""
    if not s.net:
        return ()
    return tuple(m for m in p_to_d_heads(s, c.scenario.transfer_queues != "shared")
                 if m.kind == kind and m.rid == r)


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
