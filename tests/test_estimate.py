"""The exhaustive engine's size estimate (reqmodel/engines/estimate.py):
recorded from the current model, every built-in inside its band, and a
refusal before any work."""
import json
import subprocess
import sys

from reqmodel.engines import estimate
from reqmodel.model import releases, scenario


def test_the_recorded_counts_are_the_current_models(explored):
    """sizes.json is what tools/size_data.py --write would write now: a
    model change that moves a count fails here until it is re-recorded."""
    recorded = {r["scenario"]: r for r in estimate.measured()}
    assert sorted(recorded) == sorted(scenario.builtin_names())
    for name, r in recorded.items():
        assert r["size"] == scenario.size(scenario.builtin(name)), name
        states = max(explored(rel, name).states for rel in releases.NAMES)
        assert r["states"] == states, (name, r["states"], states)


def test_every_built_in_lies_inside_the_band():
    for r in estimate.measured():
        est = estimate.estimate(scenario.builtin(r["scenario"]))
        assert est.low <= r["states"] <= est.high, (r, est)
        assert est.low <= est.mid <= est.high


def test_the_fit_recovers_a_known_line():
    rows = [{"size": w, "states": 10 ** (1 + 0.25 * w)} for w in range(4, 20)]
    a, b, band = estimate.fit(rows)
    assert abs(a - 1) < 1e-9 and abs(b - 0.25) < 1e-9 and band < 1e-9
    rows[3]["states"] *= 100  # one count two orders of magnitude off: the band covers it
    assert estimate.fit(rows)[2] > 1.5


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          cwd=cwd, capture_output=True, text=True)


def test_a_scenario_past_max_states_is_refused_before_any_work(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text(_run("scenarios", "two-valid", cwd=tmp_path).stdout.replace(
        'name = "two-valid"', 'name = "mine"'))
    r = _run("check", "--scenario-file", str(f), "--max-states", "10", "--out", "o",
             cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "estimated" in r.stderr and "even at the low end" in r.stderr
    assert "states," not in r.stderr and not (tmp_path / "o").exists()  # nothing explored
    r = _run("check", "--scenario-file", str(f), "--release", "0.5.21", "--workers", "1",
             "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "mine: estimated" in " ".join(r.stderr.split())
    r = _run("check", "--scenario-file", str(f), "--release", "0.5.21", "--workers", "1",
             "--json", "--out", "o", cwd=tmp_path)
    assert "estimated" not in r.stderr and json.loads(r.stdout)["summary"]


def test_a_range_of_counts_reads_one_way():
    """'151 to 186 k' read as 151 thousand to 186 thousand: counts are
    written whole below a million and in words beyond."""
    assert estimate._n(151) == "151" and estimate._n(186_066) == "186,066"
    assert estimate._n(3_200_000_000) == "3.2 billion"
    text = estimate.Estimate(12, 151, 5_000, 186_066).describe()
    assert text.startswith("estimated 151 to 186,066 distinct states")
