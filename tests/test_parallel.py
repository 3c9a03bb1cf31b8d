"""The parallel exhaustive engine gives the sequential engine's answer: the
same states, edges, depth, fired actions and emitted events, and the same
verdicts with the same traces, step for step; with ``stop_early`` it cuts
where the sequential engine stops.  ``fork_at`` is set low so the workers
really fork on these small scenarios."""
import json

import attrs
import pytest
from reqmodel.cli.commands import main
from reqmodel.engines import exhaustive, parallel
from reqmodel.model import properties, releases, scenario

ALL = properties.select([])
SAFETY = [p for p in ALL if not p.kind.on_graph]


def run(capsys, *argv):
    """``reqmodel ARGV`` in this process (so a lowered ``FORK_AT`` holds): exit status, output."""
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    got = capsys.readouterr()
    return done.value.code, got.out, got.err


def fields(ex):
    out = attrs.asdict(ex, recurse=False)
    del out["seconds"], out["workers"]
    return out


def both(rel, sc, props, stop_early, workers=2, **kw):
    a = exhaustive.explore(releases.get(rel), scenario.builtin(sc), props,
                           stop_early=stop_early, keep_graph=False, keep_states=True, **kw)
    b = parallel.explore(releases.get(rel), scenario.builtin(sc), props, workers,
                         exhaustive.DEFAULT_MAX_STATES, stop_early, keep_states=True,
                         fork_at=8, **kw)
    assert (a.workers, b.workers) == (1, workers)  # the workers did fork
    return a, b


@pytest.mark.parametrize("rel,sc", [("0.5.19", "incident"), ("0.5.21", "late-result-unit"),
                                    ("0.5.20", "two-valid"), ("0.5.19", "retract-abort")])
def test_exhausting_with_every_property_gives_the_sequential_exploration(rel, sc):
    a, b = both(rel, sc, ALL, stop_early=False)
    assert a.states > 100
    assert fields(a) == fields(b)


@pytest.mark.parametrize("rel,sc", [("0.5.19", "incident"), ("0.5.19", "retract-abort"),
                                    ("0.5.19", "room-reuse")])
def test_the_liveness_analysis_gets_the_sequential_edges(rel, sc, monkeypatch):
    """Every edge, in the sequential engine's order, with its step and
    whether it is the deployment's own: the workers send a successor once a
    round and record its repeats as aliases of the first (``_Shard.expand``)."""
    got = []
    real = exhaustive.verdicts_of

    def spy(ctx, props, applicable, found, states, parent, ledges, canon):
        got.append([(u, v, ledges.instances[i], own) for u, v, i, own
                    in zip(ledges.src, ledges.dst, ledges.inst, ledges.mine)])
        return real(ctx, props, applicable, found, states, parent, ledges, canon)

    monkeypatch.setattr(exhaustive, "verdicts_of", spy)
    monkeypatch.setattr(parallel, "verdicts_of", spy)
    a, b = both(rel, sc, ALL, stop_early=False)
    assert len(got) == 2 and len(got[0]) == a.edges > 300
    assert got[0] == got[1]


@pytest.mark.parametrize("workers", [2, 3])
def test_stopping_early_cuts_where_the_sequential_engine_stops(workers):
    # only properties the scenario violates, so both engines stop before the end
    full = exhaustive.explore(releases.get("0.5.19"), scenario.builtin("incident"), SAFETY,
                              stop_early=False, keep_graph=False)
    violated = [p for p in SAFETY if full.verdicts[p.name].verdict == "violated"]
    assert violated
    a, b = both("0.5.19", "incident", violated, stop_early=True, workers=workers)
    assert not a.complete and a.states < full.states
    assert fields(a) == fields(b)
    for p in violated:
        assert b.verdicts[p.name].trace.steps == a.verdicts[p.name].trace.steps


def test_without_symmetry_the_answer_is_the_same():
    a, b = both("0.5.21", "incident", SAFETY, stop_early=False, symmetry=False)
    assert fields(a) == fields(b)


def test_a_search_whose_levels_stay_small_never_forks():
    ex = parallel.explore(releases.get("0.5.19"), scenario.builtin("incident"), SAFETY, 2,
                          exhaustive.DEFAULT_MAX_STATES, fork_at=10_000)
    assert ex.workers == 1 and ex.states == 1130


def test_the_bound_is_the_sequential_one():
    with pytest.raises(exhaustive.BoundExceeded, match="more than 50 distinct states"):
        parallel.explore(releases.get("0.5.19"), scenario.builtin("incident"), ALL, 2, 50,
                         stop_early=False, fork_at=8)
    # a search that stops early within the bound is not refused
    one = properties.select(["no-foreign-kv-read"])
    seq = exhaustive.explore(releases.get("0.5.19"), scenario.builtin("incident"), one,
                             keep_graph=False)
    got = parallel.explore(releases.get("0.5.19"), scenario.builtin("incident"), one, 2,
                           seq.states, fork_at=8)
    assert got.states == seq.states


def test_a_failing_worker_is_reported(monkeypatch):
    def boom(self, k, n):
        raise ValueError("boom in a worker")
    monkeypatch.setattr(parallel._Shard, "keep_part", boom)
    with pytest.raises(RuntimeError, match="boom in a worker"):
        parallel.explore(releases.get("0.5.19"), scenario.builtin("incident"), SAFETY, 2,
                         exhaustive.DEFAULT_MAX_STATES, fork_at=8)


def test_workers_from_the_environment(monkeypatch):
    monkeypatch.setenv("REQMODEL_WORKERS", "3")
    assert parallel.workers_from_env() == 3
    monkeypatch.delenv("REQMODEL_WORKERS")
    assert parallel.workers_from_env() >= 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("REQMODEL_WORKERS", bad)
        with pytest.raises(ValueError, match="REQMODEL_WORKERS"):
            parallel.workers_from_env()


def test_check_gives_the_same_json_on_any_number_of_workers(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(parallel, "FORK_AT", 8)
    out = {}
    for w in ("1", "2"):
        code, stdout, err = run(capsys, "check", "--release", "0.5.19,0.5.21", "--scenario",
                                "incident", "--workers", w, "--json", "--out", str(tmp_path / w))
        assert code == 0, err
        got = json.loads(stdout)
        for row in got["results"]:
            row.pop("seconds")
            if row["trace_file"]:
                row["trace_file"] = row["trace_file"].replace(str(tmp_path / w), "OUT")
        out[w] = got
    assert out["1"] == out["2"]
    files = sorted(p.name for p in (tmp_path / "1").rglob("*.json"))
    assert files and files == sorted(p.name for p in (tmp_path / "2").rglob("*.json"))
    for name in files:
        a = next((tmp_path / "1").rglob(name)).read_text()
        b = next((tmp_path / "2").rglob(name)).read_text()
        assert a == b


def test_workers_is_refused_where_it_means_nothing(tmp_path, monkeypatch, capsys):
    code, _, err = run(capsys, "check", "--engine", "z3", "--workers", "2", "--out", str(tmp_path))
    assert code == 2 and err.strip() == "reqmodel: --workers, --fingerprints and --ray are for --engine exhaustive"
    monkeypatch.setenv("REQMODEL_WORKERS", "many")
    code, _, err = run(capsys, "check", "--out", str(tmp_path))
    assert code == 2 and "REQMODEL_WORKERS='many'" in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_equal_values_of_other_types_keep_their_own_field():
    """``(False, False) == (0, 0)``: the interner, the codec between shards
    and the Ray placement key each keep a field's values apart from another
    field's, so ``room_slots`` stays integers and ``aborted_by_client``
    booleans (a stored state once showed ``room_slots=(False, False)``)."""
    from reqmodel.engines import raycluster
    sc = scenario.builtin("room-reuse")
    ex = exhaustive.explore(releases.get("0.5.19"), sc, SAFETY, stop_early=False,
                            keep_graph=False, keep_states=True)
    assert {repr(s.room_slots) for s in ex.state_of} == {"(0, 0)"}
    assert {type(x) for s in ex.state_of for x in s.aborted_by_client} == {bool}
    send, recv = parallel._Codec(hashes=True), parallel._Codec({}, hashes=True)
    got = recv.unpack(send.pack([(s, i, None, False) for i, s in enumerate(ex.state_of[:300])]))
    assert [g[0] for g in got] == ex.state_of[:300]
    assert [repr(g[0]) for g in got] == [repr(s) for s in ex.state_of[:300]]
    assert [hash(g[0]) for g in got] == [hash(s) for s in ex.state_of[:300]]
    # the placement key of a state does not depend on what the process saw first
    a, b = raycluster.StableKey(), raycluster.StableKey()
    sample = ex.state_of[:200]
    assert [a(s) for s in sample] == [b(s) for s in reversed(sample)][::-1]
