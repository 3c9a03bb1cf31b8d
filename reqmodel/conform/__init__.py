"""Conformance: replay the model's seam steps against the released wheels.

``setup`` builds the conformance environment from the repo's own files (a
venv with ``requirements.txt`` under ``constraints.txt``, and each release's
wheel installed ``--no-deps`` into its own tree); ``run`` sends the model's
cases (``cases.py``) to one worker process per release (``worker.py``, which
drives the real code through ``adapter.py``) and compares what the real code
did with what the model predicted.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Callable, List, Sequence

import attrs

from reqmodel.model.releases import Release

HERE = pathlib.Path(__file__).parent
REQUIREMENTS = HERE / "requirements.txt"
CONSTRAINTS = HERE / "constraints.txt"
# 0.5.19/0.5.20 import xgrammar at top level; --no-deps, or it pulls triton back
NO_DEPS = ["xgrammar==0.2.7"]
DEFAULT_DIR = pathlib.Path(os.environ.get("REQMODEL_CONFORM_DIR", ".conform"))


class ConformError(RuntimeError):
    """A one-line, user-facing failure (the CLI prints it and exits 2)."""


def python(root: pathlib.Path) -> pathlib.Path:
    return root / "venv" / "bin" / "python"


def tree(root: pathlib.Path, release: str) -> pathlib.Path:
    return root / "sgl" / release


def _stamp() -> str:
    h = hashlib.sha256()
    for f in (REQUIREMENTS, CONSTRAINTS):
        h.update(f.read_bytes())
    h.update(" ".join(NO_DEPS).encode())
    return h.hexdigest()[:16]


def _pip(root: pathlib.Path, *args: str, what: str) -> None:
    cmd = [str(python(root)), "-m", "pip", "--disable-pip-version-check", "-q", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConformError(f"cannot install {what}: {last}")


def setup(root: pathlib.Path, releases: Sequence[str],
          step: Callable[[str], None] = lambda msg: None) -> None:
    """Create or complete the environment; every part that is already there
    (same requirements, same release trees) is kept."""
    root.mkdir(parents=True, exist_ok=True)
    if not python(root).exists():
        step("creating the virtual environment")
        res = subprocess.run([sys.executable, "-m", "venv", str(root / "venv")],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise ConformError(f"cannot create a venv in {root / 'venv'}: "
                               f"{res.stderr.strip()[-200:]}")
    stamp = root / "venv" / ".reqmodel-stamp"
    if not stamp.exists() or stamp.read_text() != _stamp():
        step("installing the pinned dependencies (torch 2.13.0 CPU, about 1.3 GB)")
        _pip(root, "install", "-c", str(CONSTRAINTS), "-r", str(REQUIREMENTS),
             what="the conformance dependencies")
        _pip(root, "install", "--no-deps", *NO_DEPS, what=" ".join(NO_DEPS))
        stamp.write_text(_stamp())
    wheels = root / "wheels"
    for rel in releases:
        if (tree(root, rel) / "sglang" / "srt").is_dir():
            continue
        step(f"installing sglang {rel} (--no-deps)")
        _pip(root, "download", "--no-deps", "-d", str(wheels), f"sglang=={rel}",
             what=f"the sglang {rel} wheel")
        wheel = sorted(wheels.glob(f"sglang-{rel}-*.whl"))
        if not wheel:
            raise ConformError(f"pip download gave no wheel for sglang {rel}")
        _pip(root, "install", "--no-deps", "--target", str(tree(root, rel)), str(wheel[-1]),
             what=f"sglang {rel}")


def ready(root: pathlib.Path, release: str) -> bool:
    return python(root).exists() and (tree(root, release) / "sglang" / "srt").is_dir()


def require(root: pathlib.Path, release: str) -> None:
    if not ready(root, release):
        raise ConformError(f"the conformance environment has no sglang {release} in {root}; "
                           f"run: reqmodel conform --setup --release {release}")


@attrs.frozen
class Mismatch:
    seam: str
    origin: str
    inputs: dict
    model: dict
    real: dict


@attrs.frozen
class Outcome:
    release: str
    model_release: str
    scenarios: int
    mismatches: List[Mismatch]
    seconds: float
    features: dict
    seams: dict  # seam -> cases

    def as_json(self) -> dict:
        return {"release": self.release, "model_release": self.model_release,
                "scenarios": self.scenarios, "mismatches": len(self.mismatches),
                "seconds": round(self.seconds, 2), "seams": self.seams}


def _worker(root: pathlib.Path, release: str, request: dict,
            script: str = "worker.py") -> dict:
    """Run ``script`` (the worker) for ``release`` on one request; its JSON answer."""
    require(root, release)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree(root, release)), str(HERE)]),
               PYTHONNOUSERSITE="1")
    res = subprocess.run([str(python(root)), str(HERE / script)],
                         input=json.dumps(request), capture_output=True, text=True, env=env)
    if res.returncode != 0 or not res.stdout.strip():
        last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConformError(f"the sglang {release} worker failed: {last}")
    return json.loads(res.stdout)


def drive(root: pathlib.Path, release: str, worker_cases: List[dict]) -> dict:
    """Run the worker for ``release`` on ``worker_cases``; its JSON answer."""
    return _worker(root, release, {"cases": worker_cases})


def dump_flags(root: pathlib.Path, release: str, argv: Sequence[Sequence[str]] = ()) -> dict:
    """The release's server flags and environment variables, as its own code
    defines them (``flagdump.py``): what ``reqmodel audit`` parses with; and
    each of ``argv`` as the release's own parser reads it (``parsed``)."""
    return _worker(root, release, {"argv": [list(a) for a in argv]}, script="flagdump.py")


def drive_traces(root: pathlib.Path, release: str, traces: List[dict]) -> List[dict]:
    """Run the worker for ``release`` on whole traces (``tracerig.py``), one
    fresh set of real objects each; the replay of each."""
    return _worker(root, release, {"traces": traces})["replays"]


def compare(cases, answer: dict) -> List[Mismatch]:
    from reqmodel.conform.cases import pages
    out = []
    for case, real in zip(cases, answer["observations"]):
        model = json.loads(case.expect)
        seen = dict(real)
        if "tokens" in seen:
            seen["pages"] = pages(seen.pop("tokens"))
        if seen != model:
            out.append(Mismatch(case.seam, case.origin, json.loads(case.inputs), model, real))
    return out


def run(root: pathlib.Path, release: Release, model_release: Release,
        target: int = 1000) -> Outcome:
    from reqmodel.conform import cases as cases_mod
    require(root, release.name)  # before the model spends a minute on cases
    t0 = time.perf_counter()
    cases = cases_mod.model_cases(model_release, target)
    answer = drive(root, release.name, [c.to_worker() for c in cases])
    seams: dict = {}
    for c in cases:
        seams[c.seam] = seams.get(c.seam, 0) + 1
    return Outcome(release.name, model_release.name, len(cases), compare(cases, answer),
                   time.perf_counter() - t0, answer["features"], seams)
