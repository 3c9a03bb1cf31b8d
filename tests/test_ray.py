"""The exhaustive search on a Ray cluster (``check --ray``) gives the
one-process answer: the same states, edges, depth, fired actions and
emitted events, and the same verdicts with the same traces, step for step.
It runs on a local Ray instance with two workers (CI installs the ``ray``
extra with the test extra); ``fork_at`` is set low so that the actors
really take over on these small scenarios."""
import json
import sys

import pytest

from reqmodel.cli.commands import main
from reqmodel.engines import exhaustive, raycluster
from reqmodel.model import releases, scenario
from tests.test_parallel import ALL, fields, SAFETY


@pytest.fixture(scope="module")
def ray():
    got = raycluster.connect("local")
    yield got
    got.shutdown()


def both(rel, sc, props, stop_early, workers=2):
    a = exhaustive.explore(releases.get(rel), scenario.builtin(sc), props,
                           stop_early=stop_early, keep_graph=False, keep_states=True)
    b = exhaustive.explore(releases.get(rel), scenario.builtin(sc), props,
                           stop_early=stop_early, keep_graph=False, keep_states=True,
                           workers=workers, fork_at=8, ray="local")
    assert (a.workers, b.workers) == (1, workers)  # the actors did take over
    return a, b


@pytest.mark.parametrize("rel,sc", [("0.5.19", "incident"), ("0.5.21", "prefill-tp-failure")])
def test_a_ray_search_gives_the_sequential_exploration(ray, rel, sc):
    a, b = both(rel, sc, ALL, stop_early=False)
    assert a.states > 100
    assert fields(a) == fields(b)


def test_a_ray_search_stops_early_where_the_sequential_one_does(ray):
    full = exhaustive.explore(releases.get("0.5.19"), scenario.builtin("incident"), SAFETY,
                              stop_early=False, keep_graph=False)
    violated = [p for p in SAFETY if full.verdicts[p.name].verdict == "violated"]
    a, b = both("0.5.19", "incident", violated, stop_early=True, workers=3)
    assert not a.complete and a.states < full.states
    assert fields(a) == fields(b)


def test_the_place_key_is_the_same_in_every_process(ray):
    """Shards are placed by ``StableKey``, not ``hash`` (on 3.11 ``hash(None)``
    is an address): two fresh processes give a state the same key."""
    ex = exhaustive.explore(releases.get("0.5.19"), scenario.builtin("incident"), SAFETY,
                            stop_early=False, keep_graph=False, keep_states=True)
    sample = ex.state_of[::97]
    keys = ray.get([ray.remote(lambda ss: [raycluster.StableKey()(s) for s in ss]).remote(sample)
                    for _ in range(2)])
    assert keys[0] == keys[1] == [raycluster.StableKey()(s) for s in sample]
    assert len(set(keys[0])) > len(sample) // 2


def run(capsys, *argv):
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    got = capsys.readouterr()
    return done.value.code, got.out, got.err


def test_check_with_ray_gives_the_same_json(ray, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("reqmodel.engines.parallel.FORK_AT", 8)
    args = ["check", "--scenario", "prefill-tp-failure", "--release", "0.5.22", "--json"]
    code, one, _ = run(capsys, *args, "--workers", "1", "--out", str(tmp_path / "a"))
    assert code == 0
    code, many, err = run(capsys, *args, "--ray", "local", "--out", str(tmp_path / "b"))
    assert code == 0, err
    timing = ("seconds", "engine_seconds", "trace_file")

    def strip(out):
        return [{k: v for k, v in r.items() if k not in timing} for r in json.loads(out)["results"]]
    assert strip(one) == strip(many)
    assert (sorted(p.name for p in (tmp_path / "a").rglob("*.json"))
            == sorted(p.name for p in (tmp_path / "b").rglob("*.json")))


@pytest.mark.parametrize("argv,says", [
    (["--ray", "local", "--engine", "hypothesis"], "are for --engine exhaustive"),
    (["--ray", "local", "--fingerprints"], "drop --ray"),
    (["--ray", "127.0.0.1:9"], "no Ray cluster answers there"),
    (["--ray", "nowhere"], "expected local, auto, HOST:PORT"),
])
def test_ray_bad_input_is_one_line(tmp_path, capsys, argv, says):
    code, out, err = run(capsys, "check", "--scenario", "incident", *argv,
                         "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert says in err and not (tmp_path / "o").exists()


def test_without_ray_installed_the_option_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    code, out, err = run(capsys, "check", "--scenario", "incident", "--ray", "local",
                         "--out", str(tmp_path / "o"))
    assert code == 2 and "pip install 'reqmodel[ray]'" in err and len(err.strip().splitlines()) == 1
