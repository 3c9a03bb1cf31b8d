"""Regenerate ``reqmodel/audit/flags/<release>.json``: each release's server
flags and environment variables, dumped from its own code in the conformance
environment (``reqmodel conform --setup`` first).

    python tools/flag_dump.py            # report which files differ
    python tools/flag_dump.py --write    # rewrite them

The conformance suite (tests/test_audit_flags.py) fails when a committed file
differs from the wheel's.
"""
import sys

from reqmodel.audit import flags
from reqmodel.conform import DEFAULT_DIR, dump_flags
from reqmodel.model import releases


def main() -> int:
    write = "--write" in sys.argv[1:]
    stale = []
    for name in releases.RELEASES:
        text = flags.encode(dump_flags(DEFAULT_DIR, name))
        path = flags.path(name)
        if not path.exists() or path.read_text() != text:
            stale.append(name)
            if write:
                path.write_text(text)
    print(("rewrote " if write else "differ: ") + (", ".join(stale) or "none"))
    return 1 if stale and not write else 0


if __name__ == "__main__":
    sys.exit(main())
