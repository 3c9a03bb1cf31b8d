"""--disaggregation-enable-kv-checksum forced on for both roles (0.5.21+,
#39500): prefill digests what it sends, decode verifies before attention."""

base = "0.5.21"
scenario_overrides = {"prefill": {"kv_checksum": True}, "decode": {"kv_checksum": True}}
