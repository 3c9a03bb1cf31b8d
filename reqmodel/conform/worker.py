"""The conformance worker: one process per release, inside the conformance
environment. Reads ``{"cases": [...]}`` as JSON on stdin and prints
``{"features": {...}, "observations": [...], "seconds": s}`` on stdout; each
observation is the real code's observable effects for one case, or
``{"error": "..."}`` when the real code raised.

Usage (``reqmodel conform`` runs it)::

    PYTHONPATH=<release tree>:<this folder> <env>/bin/python worker.py < cases.json
"""
import contextlib
import io
import json
import logging
import os
import sys
import time
import warnings


def main() -> int:
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    cases = json.load(sys.stdin)["cases"]
    # sglang prints on import and on some calls; keep stdout for the answer
    with contextlib.redirect_stdout(io.StringIO()):
        import shims
        shims.install()
        import adapter
        feats = adapter.setup()
        logging.disable(logging.CRITICAL)
        t0 = time.perf_counter()
        out = []
        for case in cases:
            try:
                out.append(adapter.SEAMS[case["seam"]](case))
            except Exception as e:  # reported per case, compared as a mismatch
                out.append({"error": f"{type(e).__name__}: {e}"})
        seconds = time.perf_counter() - t0
    json.dump({"features": feats, "observations": out, "seconds": seconds}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # skip the gloo group's and torch's slow teardown


if __name__ == "__main__":
    sys.exit(main())
