"""User code: guard proposals are Python files the user writes, imported
and called in this process, like pytest's ``conftest.py``. They are trusted
code: a proposal can do anything the user running reqmodel can. What this
module adds is a boundary against mistakes, not a sandbox:

* whatever a proposal raises, ``SystemExit`` included, becomes one line
  (:class:`UserCodeError`), never a traceback or an exit status of its own;
  only Ctrl-C (``KeyboardInterrupt``) still stops the command;
* code that runs too long (``while True: pass`` at import or inside a
  guard) is stopped by a watchdog: a SIGALRM tick, armed for the whole
  command by :func:`watchdog`, that raises inside the user code once one call
  has run longer than its limit.

The limit is :data:`GUARD_SECONDS` per guard call (twice that for importing
the file), ``$REQMODEL_USERCODE_SECONDS`` (default 10). A guard is called
tens of times per model state, so the wrapper only stamps the time on entry
(:func:`enter` / :func:`leave`); the tick does the comparing.

Where SIGALRM does not exist (Windows) or the command does not run on the
main thread, nothing is armed and a looping proposal hangs, as any
``conftest.py`` would.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Iterator, Optional

TICK = 0.25  # seconds between the watchdog's looks


class UserCodeError(ValueError):
    """User code that failed or ran too long; one line naming the file."""


class Overrun(BaseException):
    """Raised by the watchdog inside user code that ran past its limit (a
    ``BaseException``, so that the user's own ``except Exception`` does not
    swallow it)."""


def guard_seconds() -> float:
    """The limit of one guard call, read from the environment each time."""
    got = os.environ.get("REQMODEL_USERCODE_SECONDS", "").strip()
    if not got:
        return 10.0
    try:
        value = float(got)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise UserCodeError(f"REQMODEL_USERCODE_SECONDS={got[:40]!r}: expected seconds, "
                            "more than 0 and at most 86400")
    return value


class _Watch:
    """What user code runs now (None: none), since when, and for how long it may."""

    what: Optional[str] = None
    since: float = 0.0
    limit: float = 10.0


_WATCH = _Watch()


def enter(what: str, limit: float) -> None:
    _WATCH.limit = limit
    _WATCH.since = time.monotonic()
    _WATCH.what = what


def leave() -> None:
    _WATCH.what = None


def _tick(signum, frame) -> None:  # noqa: ARG001 (signal handler)
    what = _WATCH.what
    if what is not None and time.monotonic() - _WATCH.since > _WATCH.limit:
        _WATCH.what = None
        raise Overrun(what)


def overrun_message(what: str) -> str:
    return f"{what} did not finish within {_WATCH.limit:g} s (a loop that never ends?)"


def _can_arm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def watchdog() -> Iterator[None]:
    """Arm the watchdog's tick for the block and restore what was there."""
    if not _can_arm():
        yield
        return
    old = signal.signal(signal.SIGALRM, _tick)
    signal.setitimer(signal.ITIMER_REAL, TICK, TICK)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        leave()


def rearm_after_fork() -> None:
    """A forked child inherits the handler but not the timer: start it
    again when the parent had the watchdog armed."""
    if _can_arm() and signal.getsignal(signal.SIGALRM) is _tick:
        signal.setitimer(signal.ITIMER_REAL, TICK, TICK)


def describe(exc: BaseException) -> str:
    """An exception as one short line: ``Type: first line of the message``."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r})"
    try:
        text = str(exc).strip().splitlines()
    except BaseException:  # noqa: BLE001 (a user exception whose __str__ fails)
        text = []
    first = text[0] if text else ""
    if len(first) > 120:
        first = first[:117] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
