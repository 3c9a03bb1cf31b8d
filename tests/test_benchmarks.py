"""The benchmark scripts run, and the side-by-side mode compares like with
like (what they measure is reported in notes/performance.md, never asserted
here: timings are not tests)."""
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="the baseline is checked out with git archive")
def test_bench_explore_side_by_side_finds_the_same_states_and_verdicts():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_explore.py"),
                          "--scenario", "decode-reject,incident", "--release", "0.5.19",
                          "--baseline", "HEAD", "--no-graph"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["scenario"] for r in rows] == ["decode-reject", "incident"]
    for r in rows:
        assert r["same"] is True
        assert r["baseline"]["states"] == r["states"] > 0
        assert r["states_per_cpu_s"] > 0 and r["speedup"] > 0


def test_bench_explore_with_workers_finds_the_same_states_and_verdicts():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_explore.py"),
                          "--scenario", "incident", "--release", "0.5.21", "--workers", "2"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    (row,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert row["same"] is True and row["states"] == 480
    assert row["parallel"]["seconds"] > 0 and row["speedup"] > 0


def test_bench_explore_exhausts_a_scenario_file_with_fingerprints():
    # the incident's file: with fingerprints the liveness properties are
    # checked in their deadlock forms, and 0.5.23 breaks that of
    # answered-without-timeout (as `reqmodel check --fingerprints` says)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_explore.py"),
                          "--scenario-file", str(ROOT / "reqmodel" / "scenarios" / "incident.toml"),
                          "--release", "0.5.19,0.5.23", "--fingerprints", "--markdown"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "fingerprints" in out.splitlines()[0]
    rows = {r[2].strip(): r for r in (line.split("|") for line in out.splitlines()
                                      if line.startswith("| incident"))}
    assert rows["0.5.19"][3].strip() == "1,130"
    assert "no-foreign-kv-read (29)" in rows["0.5.19"][10]
    assert rows["0.5.23"][10].strip() == "answered-without-timeout (22)"


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "scenarios").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_benchmark_scenario_files_load_within_the_hard_bounds(path):
    from reqmodel.model import scenario
    sc = scenario.load_file(str(path))  # the exhaustive engine's bounds
    assert sc.name == path.stem


def test_memory_benchmark_measures_each_mode():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"),
                          "--scenario", "incident", "--release", "0.5.19"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    row = out.splitlines()[-1].split("|")
    assert row[1].strip() == "incident" and row[3].strip() == "1,130"
    assert len(row) == 8  # states, fingerprints and graph columns


def test_ray_benchmark_finds_the_same_answer_and_measures_the_actors():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ray.py"),
                          "--scenario", "prefill-tp-failure", "--release", "0.5.22"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    (row,) = [line.split("|") for line in out.splitlines() if line.startswith("| prefill")]
    assert row[3].strip() == "7,367" and row[-2].strip() == "yes"
    assert float(row[7]) > 0 and float(row[8]) > 0 and float(row[9]) > 0  # RSS, bytes, states
