"""A PD deployment as the audit sees it: each role's flags (read with the
release's own definitions), environment and startup log, reduced to what the
model and the pool-context gate need.

Every number here is the release's: the scheduler's intake limit is
``get_worker_info``'s ``max_req_input_len`` (tp_worker 19:542-556 ...
23:550-572), ``min(context_len - 1, kv_capacity - 1) - 5``;
``validate_input_length`` (managers/utils 19:206-236 ... 23:259) rejects a
prompt of that length or more, or cuts it to that length under
``--allow-auto-truncate``; the tokenizer manager refuses a prompt of
``context_len`` tokens or more before the scheduler sees it, or cuts it to
``context_len`` (tokenizer_manager 19:1172 ... 23:1338).
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import attrs

from reqmodel.audit.flags import AuditError, EnvSetting, env_for, parse

ROLES = ("prefill", "decode")

# the scheduler's startup line (scheduler.py, printed by tp rank 0 of each DP
# group): the pool the worker really got, after memory profiling and
# --max-total-tokens, and the context length after the model's config
LOG_LINE = re.compile(
    r"max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None), "
    r"max_prefill_tokens=\d+, max_running_requests=\d+, context_len=(?P<context>\d+)")
LOG_CITES = {"0.5.19": "scheduler 19:1147-1151", "0.5.20": "scheduler 20:1227-1231",
             "0.5.21": "scheduler 21:1230-1234", "0.5.22": "scheduler 22:1234-1238",
             "0.5.23": "scheduler 23:1269-1273"}
INTAKE_CITES = {"0.5.19": "tp_worker 19:542-556, managers/utils 19:206-236",
                "0.5.20": "tp_worker 20:542-556, managers/utils 20:224",
                "0.5.21": "tp_worker 21:538-548, managers/utils 21:245",
                "0.5.22": "tp_worker 22:543-553, managers/utils 22:254",
                "0.5.23": "tp_worker 23:550-572, managers/utils 23:259"}
TOKENIZER_CITES = {"0.5.19": "tokenizer_manager 19:1172", "0.5.20": "tokenizer_manager 20:1265",
                   "0.5.21": "tokenizer_manager 21:1291", "0.5.22": "tokenizer_manager 22:1343",
                   "0.5.23": "tokenizer_manager 23:1338"}
# the transfer backends the model covers (Mooncake's manager and the common
# connection code: mc / cc in notes/traceability.md)
MODELLED_BACKENDS = ("mooncake",)


@attrs.frozen
class LogFacts:
    kv_tokens: int  # the smallest max_total_num_tokens over the DP groups' lines
    context_len: int
    lines: int


def read_log(path: str, role: str, release: str) -> LogFacts:
    try:
        with open(path, "rb") as fh:
            text = fh.read(64 * 1024 * 1024).decode("utf-8", errors="replace")
    except OSError as exc:
        raise AuditError(f"--{role}-log {path}: cannot read: {exc.strerror}") from None
    found = [m for m in LOG_LINE.finditer(text)]
    if not found:
        raise AuditError(
            f"--{role}-log {path}: no 'max_total_num_tokens=..., context_len=...' line "
            f"(the scheduler's startup line, {LOG_CITES[release]}): give the worker's startup log")
    for m in found:
        if len(m["tokens"]) > 18 or len(m["context"]) > 18:
            line = text.count("\n", 0, m.start()) + 1
            raise AuditError(f"--{role}-log {path}: line {line}: a number of more than 18 digits "
                             "in the startup line")
    contexts = {int(m["context"]) for m in found}
    if len(contexts) > 1:
        raise AuditError(f"--{role}-log {path}: its startup lines name different context "
                         f"lengths {sorted(contexts)}: one log per role, from one start")
    return LogFacts(min(int(m["tokens"]) for m in found), contexts.pop(), len(found))


@attrs.frozen
class Role:
    """One role's settings that the audit reads, each with where it came from."""

    name: str
    args: Dict[str, Any] = attrs.field(repr=False)
    env: Dict[str, Any] = attrs.field(repr=False)
    context_len: int
    context_source: str
    kv_tokens: int
    kv_source: str

    @property
    def auto_truncate(self) -> bool:
        return bool(self.args["allow_auto_truncate"])

    @property
    def kv_checksum(self) -> bool:
        return bool(self.args.get("disaggregation_enable_kv_checksum", False))

    @property
    def backend(self) -> str:
        return self.args["disaggregation_transfer_backend"]

    @property
    def overlap(self) -> bool:
        return not self.args["disable_overlap_schedule"]

    @property
    def attn_tp(self) -> int:
        """Attention TP width: tp / dp with --enable-dp-attention, else tp
        (each rank publishes its own destinations, cc 21:204)."""
        tp, dp = self.args["tp_size"], self.args["dp_size"]
        return max(1, tp // dp) if self.args.get("enable_dp_attention") else tp

    @property
    def layout(self) -> Tuple[Any, ...]:
        """What each side's KV checksum digests over: its own buffers, so the
        attention TP width, PP stages, page size and KV dtype (dc 23:2580-2598)."""
        return (self.attn_tp, self.args["pp_size"], self.args["page_size"],
                self.args["kv_cache_dtype"])

    @property
    def intake_limit(self) -> int:
        """``max_req_input_len``: a prompt of this many tokens or more is
        rejected (or cut to it) at the scheduler's intake.  Without decode
        context parallelism: with --dcp-size above 1 the releases scale the
        capacity (by attn_dcp_size on 0.5.19/0.5.20, by the allocator's page
        interleave from 0.5.21), which the audit does not read
        (``unread`` says so)."""
        return min(self.context_len - 1, self.kv_tokens - 1) - 5

    def unread(self) -> List[str]:
        """Settings that change the limits in ways the audit does not compute."""
        out = []
        if int(self.args.get("dcp_size") or 1) > 1:
            out.append(f"{self.name}: --dcp-size {self.args['dcp_size']} scales the KV capacity "
                       "behind the intake limit; the limits above are without it")
        if self.args.get("speculative_algorithm"):
            out.append(f"{self.name}: --speculative-algorithm {self.args['speculative_algorithm']}"
                       ": EAGLE reserves output slots in the tokenizer's context check "
                       "(compute_num_reserved_tokens), which the limits above leave out")
        return out

    @property
    def streaming_sessions(self) -> bool:
        """``--enable-streaming-session``: without it the worker refuses to
        open a streaming session ("Streaming sessions are disabled",
        tokenizer_control_mixin 20:903-908, 23:1037-1042)."""
        return bool(self.args.get("enable_streaming_session"))

    @property
    def optimistic_attempts(self) -> int:
        return int(self.args.get("optimistic_prefill_attempts") or 0)

    def outcome(self, tokens: int) -> Tuple[str, int]:
        """What this role does with a prompt of ``tokens`` tokens: ("admit",
        0), ("truncate", n) with the length it keeps, ("reject-tokenizer", 0)
        or ("reject-intake", 0)."""
        n = tokens
        if n >= self.context_len:
            if not self.auto_truncate:
                return ("reject-tokenizer", 0)
            n = self.context_len
        if n >= self.intake_limit:
            if not self.auto_truncate:
                return ("reject-intake", 0)
            return ("truncate", self.intake_limit)
        return ("admit", 0)


def role(release: str, name: str, text: str, env: List[EnvSetting],
         log: Optional[str]) -> Role:
    args = parse(release, name, text)
    mode = args.get("disaggregation_mode")
    if mode not in (None, "null", name):
        raise AuditError(f"--{name}-args has --disaggregation-mode {mode}: give the {mode} "
                         f"server's flags in --{mode}-args")
    facts = read_log(log, name, release) if log else None
    if facts is not None:
        context, csrc = facts.context_len, f"startup log ({LOG_CITES[release]})"
    elif args.get("context_length") is not None:
        context, csrc = int(args["context_length"]), "--context-length"
    else:
        raise AuditError(f"{name}: the context length is unknown: pass --context-length in "
                         f"--{name}-args or the worker's startup log with --{name}-log")
    if facts is not None:
        kv, ksrc = facts.kv_tokens, f"startup log ({LOG_CITES[release]})"
        if facts.lines > 1:
            ksrc += f", the smallest of {facts.lines} DP groups"
    elif args.get("max_total_tokens") is not None:
        kv, ksrc = int(args["max_total_tokens"]), (
            "--max-total-tokens (an upper bound: a GPU with less memory gets a smaller pool; "
            "the startup log says)")
    else:
        raise AuditError(f"{name}: the KV pool size is unknown: pass --max-total-tokens in "
                         f"--{name}-args or the worker's startup log with --{name}-log")
    if context < 7 or kv < 7:
        raise AuditError(f"{name}: a context of {context} and a pool of {kv} tokens leave no "
                         "room for a prompt (the intake limit is min(context - 1, pool - 1) - 5)")
    return Role(name, args, env_for(release, env, name), context, csrc, kv, ksrc)


@attrs.frozen
class Band:
    """Prompt lengths ``lo`` .. ``hi`` (tokens) that both roles treat alike."""

    lo: int
    hi: int
    prefill: Tuple[str, int]
    decode: Tuple[str, int]

    @property
    def mismatch(self) -> bool:
        """The roles disagree: one admits what the other cuts or rejects, or
        they cut to different lengths."""
        return self.prefill != self.decode


def bands(p: Role, d: Role) -> List[Band]:
    """Every prompt length from 1 to past both contexts, cut where either
    role's treatment changes (its intake limit, its context); within a band
    each role admits every length whole, or cuts every length to one length,
    or rejects every length."""
    cuts = sorted({1, p.intake_limit, d.intake_limit, p.context_len, d.context_len,
                   max(p.context_len, d.context_len) + 1})
    return [Band(lo, hi - 1, p.outcome(lo), d.outcome(lo)) for lo, hi in zip(cuts, cuts[1:])]


def describe(outcome: Tuple[str, int]) -> str:
    kind, n = outcome
    return {"admit": "admitted whole", "truncate": f"cut to {n:,} tokens",
            "reject-tokenizer": "refused by the tokenizer (HTTP 400)",
            "reject-intake": "rejected at the scheduler's intake"}[kind]
