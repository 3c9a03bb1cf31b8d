"""Files a command writes: all of them, or none.

Inside :func:`transaction` (the CLI runs every command in one), a file is
not written when the command produces it but staged in memory; when the
command ends normally (exit status 0 or 1: a verdict, not an error) every
staged file is written next to its destination under a temporary name, and
only once all of them are on disk are they renamed into place. A command
that is refused part-way (a scenario over its size limit, a proposal that
raises, Ctrl-C) writes nothing; a write that fails (no space, no permission)
removes what it wrote and says which file it could not write. Renames within
one directory are atomic, so a reader never sees half a trace.

Outside a transaction (the library used from Python), :func:`write_text`
writes at once, the same way (temporary name, then rename).
"""
from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Dict, Iterator, List, Optional, Tuple


class OutputError(ValueError):
    """A file the command could not write; one line, exit status 2."""


# absolute path -> (the path as the command named it, its text)
_stage: Optional[Dict[pathlib.Path, Tuple[pathlib.Path, str]]] = None


def write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) at ``path``, or stage it inside a transaction."""
    path = pathlib.Path(path)
    if _stage is not None:
        _stage[_key(path)] = (path, text)
        return
    _commit({path: text})


def _key(path) -> pathlib.Path:
    return pathlib.Path(os.path.abspath(path))


def pending(path) -> Optional[str]:
    """The text staged for ``path`` in the running transaction, if any (a
    command that reads back what it wrote, as the audit's report reads its
    traces, sees it before it is on disk)."""
    if _stage is None:
        return None
    got = _stage.get(_key(path))
    return None if got is None else got[1]


@contextlib.contextmanager
def transaction() -> Iterator[None]:
    """Stage every file written in the block; write them when it ends with
    no exception or with ``sys.exit(0 or 1)``."""
    global _stage
    outer, _stage = _stage, {}
    ok = False
    try:
        yield
        ok = True
    except SystemExit as exc:
        ok = exc.code in (None, 0, 1)
        raise
    finally:
        staged, _stage = _stage, outer
        if ok and staged:
            if outer is not None:
                outer.update(staged)
            else:
                _commit(dict(staged.values()))


def _commit(files: Dict[pathlib.Path, str]) -> None:
    made: List[pathlib.Path] = []  # directories this commit created
    temps: List[Tuple[pathlib.Path, pathlib.Path]] = []
    current = None
    placed = 0
    try:
        for path, text in files.items():
            current = path
            for d in reversed([path.parent, *path.parent.parents]):
                if not d.exists():
                    d.mkdir()
                    made.append(d)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temps.append((tmp, path))
            tmp.write_text(text, encoding="utf-8")
        for tmp, path in temps:
            current = path
            os.replace(tmp, path)
            placed += 1
    except OSError as exc:
        for tmp, _ in temps[placed:]:
            with contextlib.suppress(OSError):
                tmp.unlink()
        why = exc.strerror or type(exc).__name__
        if placed:  # a rename failed after others succeeded: say what is there
            left = ", ".join(str(p) for _, p in temps[:placed][:3])
            more = f" and {placed - 3} more" if placed > 3 else ""
            raise OutputError(f"cannot write {current}: {why}; already written: "
                              f"{left}{more}") from None
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise OutputError(f"cannot write {current}: {why}; the command's other files "
                          "were not written either") from None
