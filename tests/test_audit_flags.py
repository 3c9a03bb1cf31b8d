"""The audit reads an operator's flags with each release's own definitions
(issue #25): the committed tables under reqmodel/audit/flags/ are what the
wheel's ServerArgs.add_cli_args and Envs define, and the parser the audit
rebuilds from them reads argument lists as the release's own parser does.
Needs the conformance environment (``pytest -m conformance``)."""
import pytest

from reqmodel import conform
from reqmodel.audit import flags
from reqmodel.model import releases

pytestmark = pytest.mark.conformance

# what operators pass, including SI / IEC sizes, aliases and switches (the
# real parser requires --model-path; the audit does not need it, so its
# parser does not ask for it)
ARGV = [["--model-path", "m"] + a for a in [
    [],
    ["--context-length", "1Mi", "--max-total-tokens", "681280", "--page-size", "64"],
    ["--model", "m", "--tensor-parallel-size", "8", "--dp-size", "2", "--enable-dp-attention",
     "--disable-overlap-schedule", "--allow-auto-truncate", "--chunked-prefill-size", "8192",
     "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
     "--kv-cache-dtype", "fp8_e4m3", "--context-length", "128k"],
    ["--pp-size", "2", "--optimistic-prefill-attempts", "2", "--max-total-tokens", "2.04M"],
    ["--tp-size", "x"],  # refused by both
    ["--disaggregation-transfer-backend", "tcp"],  # not a choice
]]
# the destinations the audit reads (reqmodel/audit/deployment.py)
READ = ("context_length", "max_total_tokens", "page_size", "allow_auto_truncate",
        "disaggregation_transfer_backend", "tp_size", "dp_size", "enable_dp_attention",
        "disable_overlap_schedule", "pp_size", "kv_cache_dtype", "disaggregation_mode",
        "optimistic_prefill_attempts", "dcp_size", "chunked_prefill_size")


@pytest.fixture(scope="module", params=releases.NAMES)
def dumped(request):
    rel = request.param
    return rel, conform.dump_flags(conform.DEFAULT_DIR, rel, ARGV)


def test_committed_table_is_the_wheels(dumped):
    rel, dump = dumped
    assert flags.path(rel).read_text() == flags.encode(dump), (
        f"reqmodel/audit/flags/{rel}.json differs from the wheel: python tools/flag_dump.py "
        "--write")


def test_the_audit_parser_reads_argv_as_the_release_does(dumped):
    rel, dump = dumped
    for argv, real in zip(ARGV, dump["parsed"]):
        text = " ".join(argv)
        if real.get("error"):
            with pytest.raises(flags.AuditError):
                flags.parse(rel, "prefill", text)
            continue
        ours = flags.parse(rel, "prefill", text)
        assert set(ours) == set(real), rel
        for key in READ:
            assert ours.get(key) == real.get(key), (rel, argv, key)


def test_checksum_flag_is_known_from_0_5_21_only():
    for rel in releases.NAMES:
        known = flags.load(rel).dest("--disaggregation-enable-kv-checksum") is not None
        assert known == (releases.get(rel).checksum is not None), rel
