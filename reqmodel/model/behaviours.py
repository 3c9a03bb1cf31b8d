"""Small release behaviours as typed values: the KV checksum a release has,
and the limit ``create_sender`` compares a prompt with. A release record
holds one value of each (``checksum``, ``sender_capacity``), so one release's
behaviour reads in one place and a proposal can replace it. (The ABORT_ACK
target policy is larger and has its own module, ``ackpolicy``.)"""
from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:  # scenario imports releases, which imports this module
    from reqmodel.model.scenario import Scenario


@attrs.frozen
class KVChecksum:
    """The digest ``--disaggregation-enable-kv-checksum`` compares (§5.8).

    ``from_prefix``: the digest starts at decode's radix prefix
    (``disagg_decode_prefix_len``, 0.5.23) instead of the prompt's first page
    (0.5.21/0.5.22); ``needs_matching_layouts``: decode skips the check when
    the two workers' KV layouts differ (0.5.23's layout-signature check);
    ``once``: decode zeroes ``expected_kv_checksum`` when it verifies (dc
    23:3307-3310, "Verified once"), where 0.5.21/0.5.22 keep it (set only at
    the commit, dc 21:2409, 22:2512) and verify it again each time the
    request enters a prebuilt batch: after a resume from retraction too (dc
    21:3030-3049, 22:3194)."""

    name: str
    from_prefix: bool
    needs_matching_layouts: bool
    once: bool

    def start(self, prefix: int) -> int:
        """The first page of the range the digest covers."""
        return prefix if self.from_prefix else 0

    def verified(self, scenario: Scenario) -> bool:
        """Decode compares the digest (the flag is on for decode, and the
        layouts match where the release requires it)."""
        return scenario.decode.kv_checksum and (scenario.layouts_match
                                                or not self.needs_matching_layouts)


PROMPT = KVChecksum("prompt", from_prefix=False, needs_matching_layouts=False, once=False)
SUFFIX = KVChecksum("suffix", from_prefix=True, needs_matching_layouts=True, once=True)
CHECKSUMS = {c.name: c for c in (PROMPT, SUFFIX)}


@attrs.frozen
class SenderCapacity:
    """The limit ``create_sender`` refuses a prompt above: the prefill pool
    (0.5.19-0.5.22) or the intake limit (0.5.23)."""

    name: str
    field: str  # the prefill Worker field that holds the limit

    def limit(self, scenario: Scenario) -> int:
        return getattr(scenario.prefill, self.field)


POOL = SenderCapacity("pool", "pool_pages")
INTAKE = SenderCapacity("intake", "intake_limit_pages")
