"""What a step did: a closed vocabulary of typed events.

An action's effect returns the next state and the events the step emitted
(acquisitions, releases, sends, reads, answers, ...). Transition properties
read them by class and named field (``isinstance(e, Read) and e.foreign``),
so a renamed field fails loudly instead of reading the wrong position, and
each event says in ``describe()`` how a person reads it in a trace.

Every event names the request it concerns (``rid``) and the worker that did
it (``side``: ``prefill``, ``decode`` or ``transfer``); ``kind`` is the
event's stable name (the same word in every engine's output).
"""
from __future__ import annotations

from typing import ClassVar, Tuple

import attrs


def _pages(pages: Tuple[int, ...]) -> str:
    return "[" + ", ".join(str(p) for p in pages) + "]"


@attrs.frozen
class Event:
    """The fields every event has."""

    kind: ClassVar[str] = "event"

    rid: int
    side: str

    def describe(self) -> str:
        return self.kind


@attrs.frozen
class Acquire(Event):
    """A worker takes a resource for the request (a sender, metadata buffer,
    KV pages, a forward pass, an inflight slot, a receiver)."""

    kind: ClassVar[str] = "acquire"
    resource: str

    def describe(self) -> str:
        return f"{self.side} acquires {self.resource}"


@attrs.frozen
class Release(Event):
    """A worker frees a resource (``held``: the request did hold it).
    ``resource == "cache"`` is ``maybe_cache_unfinished_req``."""

    kind: ClassVar[str] = "release"
    resource: str
    held: bool

    def describe(self) -> str:
        if self.resource == "cache":
            return ("prefill caches the unfinished request (maybe_cache_unfinished_req)"
                    + ("" if self.held else " though it holds NO KV"))
        return f"{self.side} releases {self.resource}{'' if self.held else ' it does NOT hold'}"


@attrs.frozen
class Send(Event):
    """Prefill hands a KV chunk to its transfer worker (``send_kv_chunk``)."""

    kind: ClassVar[str] = "send"
    last: bool
    has_metadata: bool

    def describe(self) -> str:
        return (f"prefill sends {'last ' if self.last else ''}chunk"
                f"{'' if self.has_metadata else ' with metadata_buffer_index -1'}")


@attrs.frozen
class Requeue(Event):
    """Prefill puts the request back for more prefill work."""

    kind: ClassVar[str] = "requeue"

    def describe(self) -> str:
        return "prefill requeues"


@attrs.frozen
class DoorRetire(Event):
    """A door retires the request (``reentering``: it was re-entering)."""

    kind: ClassVar[str] = "door_retire"
    reentering: bool

    def describe(self) -> str:
        return f"{self.side} door retires{' a RE-ENTERING request' if self.reentering else ''}"


@attrs.frozen
class Prealloc(Event):
    """Decode preallocates pages (``aborted``: for a request already aborted)."""

    kind: ClassVar[str] = "prealloc"
    aborted: bool

    def describe(self) -> str:
        return f"decode preallocates{' an ABORTED request' if self.aborted else ''}"


@attrs.frozen
class Read(Event):
    """Decode's attention reads the request's pages; ``foreign_pages`` are
    those whose last writer is another request."""

    kind: ClassVar[str] = "read"
    foreign_pages: Tuple[int, ...]

    @property
    def foreign(self) -> bool:
        return bool(self.foreign_pages)

    def describe(self) -> str:
        return ("attention reads " + ("FOREIGN pages " + _pages(self.foreign_pages)
                                      if self.foreign else "own pages only"))


@attrs.frozen
class LateEffect(Event):
    """A late prefill result had side effects (the kinds of events it caused)."""

    kind: ClassVar[str] = "late_effect"
    effects: Tuple[str, ...]

    def describe(self) -> str:
        return "LATE RESULT has side effects: " + ", ".join(self.effects)


@attrs.frozen
class Stream(Event):
    """A worker sends the request's final answer with HTTP ``status``; its
    finish reason tells the client the ``cause`` (``Finish.cause``: client,
    reject, failure, done)."""

    kind: ClassVar[str] = "stream"
    status: int
    cause: str = "done"

    def describe(self) -> str:
        what = {"client": "the client's abort", "reject": "a rejection",
                "failure": "a failure", "done": "completion"}.get(self.cause, self.cause)
        return f"{self.side} answers {self.status} ({what})"


@attrs.frozen
class Write(Event):
    """The transfer worker's write lands in decode pages ``pages``."""

    kind: ClassVar[str] = "write"
    pages: Tuple[int, ...]

    def describe(self) -> str:
        return f"transfer writes D pages {_pages(self.pages)}"


@attrs.frozen
class Commit(Event):
    """Decode commits the transfer: ``room`` is the room the commit check
    compared against, ``counted`` (history) the (prefill rank, request) of each
    Success report counted, ``ranks`` how many prefill ranks must report."""

    kind: ClassVar[str] = "commit"
    room: int
    counted: Tuple[Tuple[int, int], ...]
    ranks: int

    def own_ranks(self) -> frozenset:
        """Prefill ranks whose counted Success answers this request's own transfer."""
        return frozenset(q for q, o in self.counted if o == self.rid)

    def own_reports(self) -> int:
        return len(self.own_ranks())

    def describe(self) -> str:
        own = self.own_ranks()
        if len(own) >= self.ranks:
            return "decode commits the transfer"
        if not self.counted:  # the room's entry was popped after the latch
            return ("decode commits on the Success its receiver latched before another "
                    "request of the room popped the room's entry")
        reports = ", ".join(f"r{o}'s" + (f" (prefill rank {q})" if self.ranks > 1 else "")
                            for q, o in self.counted) or "no report"
        missing = tuple(q for q in range(self.ranks) if q not in own)
        text = (f"decode commits on the Success report{'s' if len(self.counted) > 1 else ''} "
                f"of {reports}")
        if self.ranks > 1:
            text += (f"; prefill rank {_pages(missing)} has not reported r{self.rid}'s own "
                     "transfer")
        return text


@attrs.frozen
class AckRelease(Event):
    """A deferred hold ends on drain acks; ``origins`` (history): whose ABORT
    the acks answer."""

    kind: ClassVar[str] = "ack_release"
    origins: Tuple[int, ...]

    def describe(self) -> str:
        others = [o for o in self.origins if o != self.rid]
        if others:
            return ("the hold ends on a drain ack that answers "
                    + ", ".join(f"r{o}" for o in others) + "'s ABORT")
        return "the hold ends on its own drain ack"


@attrs.frozen
class AckDropped(Event):
    """Decode rank ``rank`` drops an ABORT_ACK its tracker is not armed for."""

    kind: ClassVar[str] = "ack_dropped"
    rank: int

    def describe(self) -> str:
        return f"decode rank {self.rank} DROPS the ack (its tracker is not armed for it)"


@attrs.frozen
class RankRelease(Event):
    """Some decode ranks release their copy of a held request's pages."""

    kind: ClassVar[str] = "rank_release"
    ranks: Tuple[int, ...]

    def describe(self) -> str:
        return (f"decode rank(s) {_pages(self.ranks)} release their copy of the pages; "
                "other ranks still hold")


@attrs.frozen
class RanksSplit(Event):
    """Decode's ranks decide differently about one request from rank-local
    state: ``call`` (``pop_preallocated``, ``resume_retracted_reqs``) takes it
    on ranks ``took`` and leaves it queued on ranks ``kept``, whose own pools
    still hold pages or a metadata slot their peers freed."""

    kind: ClassVar[str] = "ranks_split"
    call: str
    took: Tuple[int, ...]
    kept: Tuple[int, ...]

    def describe(self) -> str:
        return (f"decode's ranks DIVERGE: {self.call} takes the request on rank(s) "
                f"{_pages(self.took)} and keeps it queued on rank(s) {_pages(self.kept)}, "
                "whose pools still hold what the others freed")


@attrs.frozen
class CorruptionAbort(Event):
    """Decode aborts the request as corrupted: the commit found another
    room's id in the metadata slot (``check == "room"``, "Context corruption
    detected", dc 21:2456-2470), or the digest decode computed over its
    pages differs from the one prefill wrote (``"checksum"``, "KV checksum
    mismatch", dc 21:3039-3081)."""

    kind: ClassVar[str] = "corruption-abort"
    check: str

    def describe(self) -> str:
        return f"decode aborts the request as corrupted ({self.check} check failed)"


@attrs.frozen
class Crash(Event):
    """An exception escapes a scheduler loop: nothing catches it between the
    call and the loop, so the worker's scheduler process dies (and with it
    every request it serves).  ``error`` is the exception, ``call`` the
    function that raises, ``cite`` the line per release."""

    kind: ClassVar[str] = "crash"
    error: str
    call: str
    why: str

    def describe(self) -> str:
        return f"{self.side} CRASHES: {self.call} raises {self.error} ({self.why})"


def poll_key_error(rid: int, side: str) -> Crash:
    """A poll of a room whose ``request_status`` entry another request
    popped: ``check_status`` is ``request_status[room]`` and raises KeyError."""
    return Crash(rid, side, "KeyError", "check_status",
                 "the room's request_status entry was popped by another request of the room")


@attrs.frozen
class StatusDropped(Event):
    """Decode drops a late status report (no receiver has the room)."""

    kind: ClassVar[str] = "status_dropped"

    def describe(self) -> str:
        return "decode drops a late status report (no receiver has the room)"


@attrs.frozen
class XferSkip(Event):
    """The transfer worker skips a chunk of a failed or gone room."""

    kind: ClassVar[str] = "xfer_skip"

    def describe(self) -> str:
        return "transfer skips the chunk (room failed or gone)"


# every event kind by its name
KINDS = {cls.kind: cls for cls in Event.__subclasses__()}
