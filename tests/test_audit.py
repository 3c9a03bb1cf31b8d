"""``reqmodel audit`` (issue #25) on real-shaped deployments: the write-up's
own (context 1,048,576 tokens, prefill pool 681,280, decode pool about
2.04 M) on 0.5.19 and 0.5.22, a matched 0.5.23 deployment, an auto-truncating
prefill with a smaller pool with and without the checksum, and 0.5.20 on
Mooncake with deferred release unset; then the pieces (the limits, the
bands, the logs, the flags) and bad input."""
import json
import subprocess
import sys

import pytest

from reqmodel.audit import deployment, derive, flags, gates
from reqmodel.model import properties, releases
from reqmodel.model import scenario as sc_mod
from reqmodel.traces import replay as rp

WRITEUP_P = "--context-length 1048576 --max-total-tokens 681280"
WRITEUP_D = "--context-length 1048576 --max-total-tokens 2040000"
SCHED = ("[2026-03-02 10:00:01{rank}] max_total_num_tokens={tokens}, chunked_prefill_size=8192, "
         "max_prefill_tokens=16384, max_running_requests=256, context_len={context}, "
         "available_gpu_mem=10.50 GB\n")


def run(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def audit(tmp_path, release, p_args, d_args, *more):
    out = tmp_path / "out"
    r = run("audit", "--release", release, "--prefill-args", p_args, "--decode-args", d_args,
            "--out", str(out), "--json", *more, cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    data = json.loads(r.stdout)
    fails = any(g["verdict"] == "fail" for g in data["gates"])
    assert r.returncode == (1 if fails else 0)
    return data


def gate(data, name):
    return next(g for g in data["gates"] if g["gate"] == name)


def props(g, verdict=None):
    return {f["property"] for f in g["findings"] if verdict is None or f["verdict"] == verdict}


def assert_traces_replay(data, tmp_path):
    """Every finding with a trace links a file that replays to its violation."""
    n = 0
    for g in data["gates"]:
        for f in g["findings"]:
            if f["trace_file"] is None:
                continue
            loaded = rp.load(f["trace_file"])
            out = rp.run(loaded)
            assert out.first_disabled_step is None, f
            assert out.violated, f
            if g["gate"] == "pool-context":  # the band's worst violation
                assert loaded.meta["property"] in f["why"]
            else:
                assert loaded.meta["property"] == f["property"]
            assert out.steps_total == f["trace_length"]
            n += 1
    return n


@pytest.fixture(scope="module")
def writeup_019(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("writeup019")
    return tmp, audit(tmp, "0.5.19", WRITEUP_P, WRITEUP_D, "--markdown", str(tmp / "r.md"))


def test_writeup_on_0_5_19_fails_admission_and_reads_foreign_kv(writeup_019):
    tmp, data = writeup_019
    assert data["release"] == "0.5.19"
    assert data["roles"]["prefill"]["intake_limit"] == 681274  # min(1048575, 681279) - 5
    assert data["roles"]["decode"]["intake_limit"] == 1048570  # min(1048575, 2039999) - 5
    assert gate(data, "pool-context")["verdict"] == "fail"
    band = next(b for b in data["prompt_lengths"] if b["roles_differ"])
    assert (band["from"], band["to"]) == (681274, 1048569)
    mismatch = gate(data, "pool-context")["findings"][0]
    assert mismatch["property"] == "roles-agree-on-prompts"
    assert mismatch["trace_file"].endswith("no-foreign-kv-read-audit-band-681274.itf.json")
    adm = gate(data, "admission")
    assert adm["verdict"] == "fail"
    assert {"rejected-never-succeeds", "reject-acquires-nothing"} <= props(adm, "fail")
    read = gate(data, "transfer-read")
    stub = next(f for f in read["findings"] if f.get("finding") == "stub-reads-foreign-kv")
    assert stub["verdict"] == "fail" and stub["trace_length"] == 29
    assert "0.5.21" in stub["fix"]
    assert assert_traces_replay(data, tmp) >= 5


def test_markdown_report_has_the_gates_and_a_diagram_per_trace(writeup_019):
    tmp, data = writeup_019
    text = (tmp / "r.md").read_text()
    for g in gates.GATES:
        assert f"## {g}: " in text
    traces = sum(1 for g in data["gates"] for f in g["findings"] if f["trace_file"])
    assert text.count("```mermaid") == traces
    assert text.count("sequenceDiagram") == traces
    assert "**What to change:**" in text and "What this audit cannot see" in text


def test_writeup_on_0_5_22_from_startup_logs_passes_admission(tmp_path):
    (tmp_path / "p.log").write_text(
        "loading...\n" + SCHED.format(rank=" TP0", tokens=681280, context=1048576))
    (tmp_path / "d.log").write_text(
        SCHED.format(rank=" DP0 TP0", tokens=2041344, context=1048576)
        + SCHED.format(rank=" DP1 TP0", tokens=2040320, context=1048576))
    data = audit(tmp_path, "0.5.22", "--tp-size 8", "--tp-size 8",
                 "--prefill-log", "p.log", "--decode-log", "d.log")
    assert data["roles"]["prefill"]["kv_tokens"] == 681280
    assert data["roles"]["decode"]["kv_tokens"] == 2040320  # the smaller DP group
    assert "startup log" in data["roles"]["decode"]["kv_tokens_from"]
    assert gate(data, "pool-context")["verdict"] == "fail"
    assert gate(data, "admission")["verdict"] == "pass"
    assert_resumed_request_warning(data)
    # the prefill-side reject still leaves decode waiting 300 s
    life = gate(data, "lifetime")
    hang = next(f for f in life["findings"] if f.get("finding") == "prefill-reject-hangs-decode")
    assert hang["verdict"] == "warn"
    assert_traces_replay(data, tmp_path)


def test_matched_0_5_23_passes_pool_context_and_admission(tmp_path):
    p = "--context-length 131072 --max-total-tokens 400000 --tp-size 4"
    d = "--context-length 131072 --max-total-tokens 900000 --tp-size 4"
    data = audit(tmp_path, "0.5.23", p, d)
    assert gate(data, "pool-context")["verdict"] == "pass"
    assert not any(b["roles_differ"] for b in data["prompt_lengths"])
    assert gate(data, "admission")["verdict"] == "pass"
    assert_resumed_request_warning(data)


def assert_resumed_request_warning(data):
    """From 0.5.21 the one foreign read every deployment's probes reach needs
    a write that outlives the 30 s deferral timeout: a warning, the timeout
    quoted (the retract-late-write probe; on 0.5.19/0.5.20 it fails)."""
    read = gate(data, "transfer-read")
    assert read["verdict"] == "warn"
    assert [(f["property"], f.get("finding"), f["verdict"]) for f in read["findings"]] == [
        ("no-foreign-kv-read", "late-write-into-resumed-request", "warn")]
    assert "30" in read["findings"][0]["why"]


AT_P = "--context-length 131072 --max-total-tokens 100000 --allow-auto-truncate"
AT_D = "--context-length 131072 --max-total-tokens 400000"
CK = " --disaggregation-enable-kv-checksum"


@pytest.mark.parametrize("release", ["0.5.21", "0.5.23"])
def test_auto_truncate_fails_transfer_read_without_the_checksum(tmp_path, release):
    data = audit(tmp_path, release, AT_P, AT_D)
    read = gate(data, "transfer-read")
    assert read["verdict"] == "fail"
    f = next(f for f in read["findings"] if f["property"] == "no-foreign-kv-read")
    assert f["finding"] == "auto-truncate-reads-foreign-kv" and f["verdict"] == "fail"
    assert_traces_replay(data, tmp_path)


@pytest.mark.parametrize("release", ["0.5.21", "0.5.23"])
def test_auto_truncate_with_the_checksum_on_both_roles_does_not_fail(tmp_path, release):
    data = audit(tmp_path, release, AT_P + CK, AT_D + CK)
    read = gate(data, "transfer-read")
    assert read["verdict"] != "fail"
    # the truncated prompt's read is caught; on 0.5.23 (checked once) the
    # late write into a resumed request is not (a warning: after 30 s)
    reads = {(f.get("finding"), f["verdict"]) for f in read["findings"]
             if f["property"] == "no-foreign-kv-read"}
    assert reads == ({("late-write-into-resumed-request", "warn")} if release == "0.5.23"
                     else set())
    check = next(f for f in read["findings"] if f["property"] == "checksum-protects")
    assert check["verdict"] == "pass"


def test_a_checksum_on_one_role_protects_nothing(tmp_path):
    data = audit(tmp_path, "0.5.22", AT_P + CK, AT_D)
    read = gate(data, "transfer-read")
    check = next(f for f in read["findings"] if f["property"] == "checksum-protects")
    assert check["verdict"] == "warn" and "protects nothing" in check["why"]
    assert read["verdict"] == "fail"  # the foreign read is still there


@pytest.mark.parametrize("release,verdicts", [
    ("0.5.22", {"no-false-corruption-abort": "fail"}),  # every good transfer fails
    ("0.5.23", {}),  # the layout signature skips the comparison
])
def test_checksum_across_layouts(tmp_path, release, verdicts):
    p = "--context-length 131072 --max-total-tokens 400000 --tp-size 2" + CK
    d = "--context-length 131072 --max-total-tokens 400000 --tp-size 2 --page-size 64" + CK
    data = audit(tmp_path, release, p, d)
    read = gate(data, "transfer-read")
    check = next(f for f in read["findings"] if f["property"] == "checksum-protects")
    assert check["verdict"] == "warn"
    for prop, v in verdicts.items():
        assert next(f for f in read["findings"] if f["property"] == prop)["verdict"] == v
    if not verdicts:
        assert "no-false-corruption-abort" not in props(read)


def test_0_5_20_mooncake_without_deferred_release_fails_lifetime(tmp_path):
    p = ("--context-length 131072 --max-total-tokens 500000 "
         "--disaggregation-transfer-backend mooncake")
    d = "--context-length 131072 --max-total-tokens 500000"
    data = audit(tmp_path, "0.5.20", p, d)
    life = gate(data, "lifetime")
    assert life["verdict"] == "fail"
    reuse = next(f for f in life["findings"] if f["property"] == "no-reuse-during-inflight-write")
    assert reuse["verdict"] == "fail"
    assert "deferred-release-on" in props(life, "warn")
    # with the variable on both roles the write waits for the drain: only a
    # deferral timeout that fires first lets the page go
    data = audit(tmp_path, "0.5.20", p, d,
                 "--env", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1")
    life = gate(data, "lifetime")
    assert life["verdict"] == "warn"
    reuse = next(f for f in life["findings"] if f["property"] == "no-reuse-during-inflight-write")
    assert reuse["verdict"] == "warn"
    assert "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT" in reuse["why"]
    assert "deferred-release-on" not in props(life)


def test_deferred_release_on_one_role_only_is_a_warning(tmp_path):
    data = audit(tmp_path, "0.5.22", "--context-length 8192 --max-total-tokens 100000",
                 "--context-length 8192 --max-total-tokens 100000",
                 "--env", "prefill:SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0")
    f = next(f for f in gate(data, "lifetime")["findings"]
             if f["property"] == "deferred-release-on")
    assert f["verdict"] == "warn" and "on decode but off on prefill" in f["why"]


def test_assumed_traffic_adds_its_scenarios(tmp_path):
    """--assume adds the probes of what the flags do not show: here a
    client's abort reaching one worker, prefill faults, whose probes quote
    decode's heartbeat settings from its environment, and a transfer worker
    that raises."""
    data = audit(tmp_path, "0.5.23", "--context-length 8192 --max-total-tokens 100000",
                 "--context-length 8192 --max-total-tokens 100000",
                 "--assume", "one-leg-abort,prefill-faults,worker-faults",
                 "--env", "decode:SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=4")
    names = [p["name"] for p in data["probes"]]
    assert "audit-one-leg-abort-abort-reaches-prefill" in names
    life = gate(data, "lifetime")
    f = next(f for f in life["findings"] if f.get("finding") == "abort-reaches-prefill-only")
    assert f["verdict"] == "warn"
    faults = [p for p in data["probes"] if p["name"].startswith("audit-prefill-faults-")]
    assert [p["shape_of"] for p in faults] == ["prefill-silent", "prefill-dies"]
    assert all("after 4 missed /health probes 5 s apart" in p["why"] for p in faults)
    shown = {f.get("finding") for f in life["findings"]}
    assert {"heartbeat-loss-leaves-prefill-bootstrapping",
            "dead-prefill-hold-delays-admission", "dead-transfer-worker-stalls-its-queue",
            "dead-transfer-worker-never-acks-abort"} <= shown
    # 0.5.23 holds a failed request's pages for prefill's drain ack: no read
    assert not any(f.get("finding") == "heartbeat-loss-frees-pages-under-live-write"
                   for f in gate(data, "transfer-read")["findings"])


def test_a_backend_the_model_does_not_cover_is_said_not_checked(tmp_path):
    data = audit(tmp_path, "0.5.22", WRITEUP_P + " --disaggregation-transfer-backend nixl",
                 WRITEUP_D + " --disaggregation-transfer-backend nixl")
    assert gate(data, "pool-context")["verdict"] == "fail"  # arithmetic, any backend
    for g in gates.GATES[1:]:
        assert props(gate(data, g)) == {"backend-modelled"}
        assert gate(data, g)["verdict"] == "warn"
    assert data["probes"] == []


# ------------------------------------------------------------ the pieces

def role(release, name, text, env=()):
    return deployment.role(release, name, text, flags.parse_env(release, list(env)), None)


def test_intake_limit_is_the_release_formula():
    r = role("0.5.22", "prefill", "--context-length 128k --max-total-tokens 1000")
    assert r.context_len == 128000 and r.intake_limit == 1000 - 1 - 5
    r = role("0.5.22", "prefill", "--context-length 1Ki --max-total-tokens 1M")
    assert r.intake_limit == 1024 - 1 - 5
    assert r.outcome(1017) == ("admit", 0)
    assert r.outcome(1018) == ("reject-intake", 0)  # validate_input_length: >=
    assert r.outcome(1024) == ("reject-tokenizer", 0)
    t = role("0.5.22", "prefill",
             "--context-length 1Ki --max-total-tokens 1M --allow-auto-truncate")
    assert t.outcome(5000) == ("truncate", 1018)


def test_bands_cover_every_length_once():
    p = role("0.5.19", "prefill", WRITEUP_P)
    d = role("0.5.19", "decode", WRITEUP_D)
    bs = deployment.bands(p, d)
    assert bs[0].lo == 1
    assert all(a.hi + 1 == b.lo for a, b in zip(bs, bs[1:]))
    assert [b.mismatch for b in bs] == [False, True, False, False]


def test_band_probes_take_the_built_in_shapes():
    p = role("0.5.21", "prefill", "--context-length 1000 --max-total-tokens 500")
    d = role("0.5.21", "decode", "--context-length 1000 --max-total-tokens 5000")
    st = derive.settings(releases.get("0.5.21"), p, d)
    probes = [derive.band_probe(b, st) for b in deployment.bands(p, d)]
    shapes = [pr.template for pr in probes if pr is not None]
    assert shapes == ["incident", "both-reject"]
    inc = next(pr for pr in probes if pr and pr.template == "incident").scenario
    ref = sc_mod.builtin("incident")
    assert inc.prompt_pages == ref.prompt_pages
    assert (inc.prefill.pool_pages, inc.decode.pool_pages) == (ref.prefill.pool_pages,
                                                               ref.decode.pool_pages)
    # the probes are scenarios a trace carries and replays
    for pr in probes:
        if pr is not None:
            assert sc_mod.from_dict(sc_mod.to_dict(pr.scenario)) == pr.scenario


def test_both_roles_cutting_to_different_lengths_is_a_band():
    p = role("0.5.22", "prefill", "--context-length 1000 --max-total-tokens 500 "
             "--allow-auto-truncate")
    d = role("0.5.22", "decode", "--context-length 1000 --max-total-tokens 700 "
             "--allow-auto-truncate")
    band = next(b for b in deployment.bands(p, d) if b.prefill[0] == b.decode[0] == "truncate")
    assert band.mismatch
    st = derive.settings(releases.get("0.5.22"), p, d)
    sc = derive.band_probe(band, st).scenario
    assert sc.prefill.intake_limit_pages < sc.decode.intake_limit_pages < sc.prompt_pages[0]
    assert sc.prefill.auto_truncate and sc.decode.auto_truncate


def test_log_with_several_starts_of_different_contexts_is_refused(tmp_path):
    (tmp_path / "x.log").write_text(SCHED.format(rank="", tokens=1000, context=2048)
                                    + SCHED.format(rank="", tokens=1000, context=4096))
    with pytest.raises(flags.AuditError, match="different context lengths"):
        deployment.read_log(str(tmp_path / "x.log"), "prefill", "0.5.22")


def test_every_property_names_a_gate_and_every_model_gate_has_properties():
    assert all(p.gate in gates.GATES[1:] for p in properties.CATALOG.values())
    for g in gates.GATES[1:]:
        assert any(p.gate == g and p.on_violation == "fail" for p in properties.CATALOG.values())


def test_properties_table_shows_the_gate(tmp_path):
    r = run("properties", cwd=tmp_path)
    assert r.returncode == 0
    assert "transfer-read (fail)" in r.stdout and "lifetime (warn)" in r.stdout


@pytest.mark.parametrize("args,fragment", [
    (["--release", "0.5.19", "--prefill-args", "--disaggregation-enable-kv-checksum",
      "--decode-args", "--context-length 1000"], "not a server flag of sglang 0.5.19"),
    (["--release", "0.5.22", "--prefill-args", "--tp-size x", "--decode-args", ""],
     "invalid int value: 'x'"),
    (["--release", "0.5.22", "--prefill-args", "--disaggregation-transfer-backend tcp",
      "--decode-args", ""], "invalid choice: 'tcp'"),
    (["--release", "0.5.22", "--prefill-args", "--context-length 1000",
      "--decode-args", "--context-length 1000 --max-total-tokens 10"], "KV pool size is unknown"),
    (["--release", "0.5.22", "--prefill-args", "a", "--prefill-args", "b",
      "--decode-args", "c"], "--prefill-args is given 2 times"),
    (["--release", "0.5.22", "--prefill-args", "--context-length 100 --max-total-tokens 100",
      "--decode-args", "--context-length 100 --max-total-tokens 100", "--decode-log", "d.log",
      "--decode-log", "d.log"], "--decode-log is given 2 times"),
    (["--release", "0.5.22", "--prefill-args", "", "--decode-args", "",
      "--prefill-log", "garbage.log"], "no 'max_total_num_tokens=..., context_len=...' line"),
    (["--release", "0.5.22", "--prefill-args", "", "--decode-args", "",
      "--prefill-log", "missing.log"], "cannot read"),
    (["--release", "0.5.22", "--prefill-args", "--disaggregation-mode decode",
      "--decode-args", ""], "give the decode server's flags in --decode-args"),
    (["--release", "0.5.22", "--prefill-args", "'unclosed", "--decode-args", ""],
     "cannot split"),
    (["--release", "0.5.22", "--prefill-args", "--config c.yaml", "--decode-args", ""],
     "--config files are not read"),
    (["--release", "all", "--prefill-args", "", "--decode-args", ""],
     "--release takes one release"),
    (["--release", "0.5.22", "--prefill-args", "", "--decode-args", "", "--env", "NOPE=1"],
     "not an environment variable sglang 0.5.22 reads"),
    (["--release", "0.5.22", "--prefill-args", "", "--decode-args", "",
      "--env", "SGLANG_REQ_WAITING_TIMEOUT=soon"], "not a number"),
    (["--release", "0.5.22", "--prefill-args", "", "--decode-args", "",
      "--env", "router:SGLANG_REQ_WAITING_TIMEOUT=1"], "must be prefill or decode"),
    (["--release", "0.5.22", "--prefill-args", "", "--decode-args", "", "--assume", "chaos"],
     "--assume chaos: unknown"),
    (["--release", "0.5.22", "--prefill-args", "--context-length 5 --max-total-tokens 5",
      "--decode-args", "--context-length 5 --max-total-tokens 5"], "leave no room"),
])
def test_bad_audit_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, fragment):
    (tmp_path / "garbage.log").write_text("no startup line here\n")
    r = run("audit", *args, "--out", "out", "--markdown", "r.md", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.md").exists()


def test_transfer_timeout_above_the_deferral_reaches_the_probes_and_the_findings(tmp_path):
    """MC_TRANSFER_TIMEOUT is the transfer engine's, read from prefill's
    environment; above the deferral timeout, a write in flight when decode
    begins to hold may outlive the hold, and the finding says so."""
    base = "--context-length 8192 --max-total-tokens 100000"
    data = audit(tmp_path, "0.5.21", base, base, "--assume", "multi-prefill",
                 "--env", "prefill:MC_TRANSFER_TIMEOUT=300")
    probe = next(p for p in data["probes"] if p["name"].endswith("inflight-reuse"))
    assert 'timeouts={"MC_TRANSFER_TIMEOUT": 300.0}' in probe["settings"]
    read = next(f for f in gate(data, "transfer-read")["findings"]
                if f["property"] == "no-foreign-kv-read" and f["scenario"].endswith("inflight-reuse"))
    assert "needs MC_TRANSFER_TIMEOUT above" in read["why"] and "300 s > 30 s" in read["why"]
    assert_traces_replay(data, tmp_path)
    # the defaults: no probe sets a timeout (the trace of inflight-reuse with
    # the defaults needs none: tests/test_clocks.py)
    p = role("0.5.21", "prefill", base)
    st = derive.settings(releases.get("0.5.21"), p, role("0.5.21", "decode", base))
    assert st.timeouts == ()
    st = derive.settings(releases.get("0.5.21"), role(
        "0.5.21", "prefill", base, ["prefill:MC_TRANSFER_TIMEOUT=300"]), role(
        "0.5.21", "decode", base, ["decode:SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=60"]))
    assert st.timeouts == (("MC_TRANSFER_TIMEOUT", 300.0),
                           ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 60.0))


def test_streaming_sessions_are_checked_where_both_roles_enable_them(tmp_path):
    """A session's in-flight mark is nothing a request owns unless the
    servers run with --enable-streaming-session: on both roles lifetime
    warns the turn an abort in decode's prealloc queue leaves in flight
    (session-turn-left-in-flight); on one role only the audit says why it
    sends no session turns; without it no finding."""
    base = "--context-length 8192 --max-total-tokens 100000"
    on = base + " --enable-streaming-session"
    for d in ("plain", "one", "both"):
        (tmp_path / d).mkdir()
    plain = audit(tmp_path / "plain", "0.5.22", base, base)
    assert not [f for f in gate(plain, "lifetime")["findings"]
                if f["property"] == "session-mark-released"]
    one = audit(tmp_path / "one", "0.5.22", base, on)
    assert not [f for f in gate(one, "lifetime")["findings"]
                if f["property"] == "session-mark-released"]
    assert any("--enable-streaming-session on decode only" in n for n in one["not_modelled"])
    data = audit(tmp_path / "both", "0.5.22", on, on)
    (found,) = [f for f in gate(data, "lifetime")["findings"]
                if f["property"] == "session-mark-released" and f.get("finding")]
    assert found["verdict"] == "warn" and found["finding"] == "session-turn-left-in-flight"
