"""Scenario loading: built-ins, TOML files, and one-line refusals."""
import pytest

from reqmodel.model import scenario
from reqmodel.model.scenario import ScenarioError


def write(tmp_path, text):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


MINIMAL = """
name = "m"
prompt_pages = [2, 1]
[prefill]
pool_pages = 2
[decode]
pool_pages = 3
"""


def test_every_builtin_loads_and_the_default_is_the_incident():
    names = scenario.builtin_names()
    assert scenario.DEFAULT in names
    for name in names:
        sc = scenario.builtin(name)
        assert sc.name == name
        assert sc.description
    inc = scenario.builtin("incident")
    # the incident: fits decode's pool, not prefill's
    assert inc.prompt_pages[0] > inc.prefill.intake_limit_pages
    assert inc.prompt_pages[0] <= inc.decode.intake_limit_pages


def test_issue_schema_keys_are_accepted(tmp_path):
    text = """
name = "incident"
prompt_pages = [3, 1]
[prefill]
pool_pages = 2
intake_limit_pages = 2
auto_truncate = false
kv_checksum = false
[decode]
pool_pages = 4
auto_truncate = false
kv_checksum = false
radix_cache = false
ranks = 1
[options]
optimistic_prefill_attempts = 0
deferred_release = "default"
layouts_match = true
[events]
client_abort = false
retract = false
preempt = false
transfer_failure = false
timeouts = false
"""
    sc = scenario.load_file(write(tmp_path, text))
    assert sc.prompt_pages == (3, 1)
    assert sc.deferred_release is None
    assert sc.prefill.intake_limit_pages == 2


def test_intake_limit_defaults_to_the_pool(tmp_path):
    sc = scenario.load_file(write(tmp_path, MINIMAL))
    assert sc.prefill.intake_limit_pages == 2 and sc.decode.intake_limit_pages == 3


def test_events_accept_request_lists(tmp_path):
    sc = scenario.load_file(write(tmp_path, MINIMAL + "[events]\nclient_abort = [1]\nretract = true\n"))
    assert sc.events.client_abort == (1,)
    assert sc.events.retract == (0, 1)
    assert sc.events.on("client_abort", 1) and not sc.events.on("client_abort", 0)


@pytest.mark.parametrize("extra,message", [
    ("[decode.x]\n", "unknown key"),
    ("colour = 1\n", "unknown key 'colour'"),
    ("[options]\nresult_timing = \"soon\"\n", "result_timing"),
    ("[options]\ndeferred_release = \"maybe\"\n", "deferred_release"),
    ("[events]\nclient_abort = [7]\n", "request 7 does not exist"),
    ("[events]\nclient_abort = \"yes\"\n", "client_abort must be"),
    ("[options]\ndecode_host_receive = \"yes\"\n", "must be true or false"),
])
def test_bad_scenarios_are_refused_in_one_line(tmp_path, extra, message):
    text = MINIMAL + extra if not extra.startswith("colour") else extra + MINIMAL
    with pytest.raises(ScenarioError) as exc:
        scenario.load_file(write(tmp_path, text))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("text,message", [
    ("name = 'x'\n", "prompt_pages"),
    ("name = 'x'\nprompt_pages = [1]\n[prefill]\npool_pages = 2\n", "[decode] table is required"),
    ("name = 'x'\nprompt_pages = [1]\n[prefill]\npool_pages = 99\n[decode]\npool_pages = 2\n", "pool_pages must be"),
    ("name = 'x'\nprompt_pages = [1]\n[prefill]\npool_pages = 2\nintake_limit_pages = 3\n[decode]\npool_pages = 2\n", "intake_limit_pages"),
    ("name = 'x'\nprompt_pages = [1]\n[prefill]\npool_pages = true\n[decode]\npool_pages = 2\n", "must be an integer"),
    ("name = 'x'\nprompt_pages = [1]\n[prefill]\npool_pages = 2\n[decode]\npool_pages = 2\nranks = 3\n", "ranks must be 1..2"),
    ("name = 'x'\nprompt_pages = [1, 1, 1, 1, 1]\n[prefill]\npool_pages = 2\n[decode]\npool_pages = 2\n", "bounded"),
    ("name = ", "invalid TOML"),
])
def test_malformed_and_out_of_bounds_files(tmp_path, text, message):
    with pytest.raises(ScenarioError) as exc:
        scenario.load_file(write(tmp_path, text))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_missing_file_and_unknown_builtin():
    with pytest.raises(ScenarioError, match="no such scenario file"):
        scenario.load_file("/nonexistent/s.toml")
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'"):
        scenario.builtin("nope")


def test_sampled_bounds_for_the_hypothesis_engine_and_replay():
    data = {"name": "big", "prompt_pages": [1, 2, 3, 20, 1, 1],
            "prefill": {"pool_pages": 24}, "decode": {"pool_pages": 24, "ranks": 4}}
    with pytest.raises(ScenarioError, match="bounded to 4"):
        scenario.from_dict(data)
    sc = scenario.from_dict(data, bounds=scenario.SAMPLED)
    assert sc.n == 6 and sc.decode.ranks == 4
    assert sc.chunk() == 20  # unchunked: the longest prompt goes in one chunk
    with pytest.raises(ScenarioError, match="bounded to 16"):
        scenario.from_dict({**data, "prompt_pages": [1] * 17}, bounds=scenario.SAMPLED)


def test_the_readme_scenario_example_loads():
    import pathlib
    import tomllib
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = readme.split("```toml\n")[1].split("```")[0]
    sc = scenario.from_dict(tomllib.loads(block))
    assert sc.shares_rooms and sc.reuse_room_after == "both"


def test_decode_host_receive_is_refused_with_the_reason(tmp_path):
    """No built-in backend accepts host destinations on any release with the
    mode (the conformance suite checks this in the wheels), so the scenario is
    refused, naming the releases and the line that refuses to start."""
    with pytest.raises(ScenarioError) as exc:
        scenario.load_file(write(tmp_path, MINIMAL + "[options]\ndecode_host_receive = true\n"))
    msg = str(exc.value)
    assert "\n" not in msg
    assert "0.5.19, 0.5.20 have no host receive" in msg
    assert "0.5.21, 0.5.22, 0.5.23 refuse to start decode" in msg and "dc 21:698-704" in msg
    off = scenario.load_file(write(tmp_path, MINIMAL + "[options]\ndecode_host_receive = false\n"))
    assert off == scenario.load_file(write(tmp_path, MINIMAL))


def test_a_release_with_a_host_capable_backend_is_not_modelled(tmp_path, monkeypatch):
    """The refusal is derived from the release records: a release whose
    backend accepted host destinations would make the mode reachable, and the
    loader then says the model does not have it, instead of the reason above."""
    import attrs
    from reqmodel.model import releases
    capable = attrs.evolve(releases.R0523, name="next", host_destination_backends=("mooncake/conn.py:MooncakeKVManager",))
    monkeypatch.setitem(releases.RELEASES, "next", capable)
    with pytest.raises(ScenarioError, match="not modelled .needed for next"):
        scenario.load_file(write(tmp_path, MINIMAL + "[options]\ndecode_host_receive = true\n"))


@pytest.mark.parametrize("name", scenario.builtin_names())
def test_to_dict_is_the_inverse_of_from_dict(name):
    sc = scenario.builtin(name)
    assert scenario.from_dict(sc.to_dict()) == sc
    assert scenario.to_dict(sc) == sc.to_dict()


def test_to_dict_round_trips_every_option_away_from_its_default():
    sc = scenario.from_dict({
        "name": "all-options", "description": "every key set", "prompt_pages": [2, 1],
        "bootstrap_rooms": [3, 3],
        "prefill": {"pool_pages": 2, "intake_limit_pages": 1, "auto_truncate": True,
                    "kv_checksum": True, "metadata_buffers": 1, "chunk_pages": 1, "ranks": 2},
        "decode": {"pool_pages": 3, "intake_limit_pages": 2, "kv_checksum": True,
                   "metadata_buffers": 2, "radix_cache": True},
        "options": {"optimistic_prefill_attempts": 1, "deferred_release": False,
                    "layouts_match": False, "sessions": True, "hybrid_mamba": True,
                    "result_timing": "any", "reuse_room_after": "decode"},
        "events": {"client_abort": [0], "timeouts": True},
    }, bounds=scenario.SAMPLED)
    assert scenario.from_dict(sc.to_dict(), bounds=scenario.SAMPLED) == sc


def test_size_is_the_engines_question_not_the_files(tmp_path):
    """A file within the hard bounds loads however many states it will have;
    the exhaustive engine refuses it, in one line with its estimate, only
    when even the estimate's low end is more than it may hold (#27)."""
    from reqmodel.engines.base import EngineInputError, refuse_large
    huge = scenario.load_file(write(tmp_path, (
        "name = 'x'\nprompt_pages = [8, 8, 8, 8]\n[prefill]\npool_pages = 8\n[decode]\n"
        "pool_pages = 8\n[events]\nclient_abort = true\n")))
    with pytest.raises(EngineInputError) as exc:
        refuse_large(huge)
    assert "estimated" in str(exc.value) and "\n" not in str(exc.value)
    two = scenario.load_file(write(tmp_path, (
        "name = 'y'\nprompt_pages = [2, 2]\n[prefill]\npool_pages = 4\n[decode]\n"
        "pool_pages = 4\n[events]\nclient_abort = true\nretract = true\npreempt = true\n")))
    refuse_large(two)  # size 22: refused by the old static guard (at most 18)
    with pytest.raises(EngineInputError, match="max-states 1,000"):
        refuse_large(two, max_states=1000)
