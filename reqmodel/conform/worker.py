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
    request = json.load(sys.stdin)
    # sglang prints on import and on some calls; keep stdout for the answer
    with contextlib.redirect_stdout(io.StringIO()):
        import shims
        shims.install()
        import adapter
        feats = adapter.setup()
        logging.disable(logging.CRITICAL)
        t0 = time.perf_counter()
        if "traces" in request:
            import tracerig
            answer = {"features": feats, "replays": [tracerig.replay(t) for t in request["traces"]],
                      "seconds": time.perf_counter() - t0}
        else:
            answer = run_cases(adapter, request["cases"], feats, t0)
    json.dump(answer, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # skip the gloo group's and torch's slow teardown


def run_cases(adapter, cases, feats, t0):
    out = []
    for case in cases:
        try:
            out.append(adapter.SEAMS[case["seam"]](case))
        except Exception as e:  # reported per case, compared as a mismatch
            out.append({"error": f"{type(e).__name__}: {e}"})
    seconds = time.perf_counter() - t0
    return {"features": feats, "observations": out, "seconds": seconds}


if __name__ == "__main__":
    sys.exit(main())
