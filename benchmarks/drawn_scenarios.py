"""Search scenarios drawn beyond the exhaustive bounds (up to 6 requests,
8-page prompts, 12-page pools, 4 decode ranks, shared bootstrap rooms, every option and event) with the Hypothesis
engine, on every release; print each violation found with its minimised
trace length and the scenario that produced it.

    python benchmarks/drawn_scenarios.py [--profile ci]
"""
import argparse
import time

from reqmodel.engines.hypothesis import engine as hypo
from reqmodel.model import properties
from reqmodel.model import releases


def describe(sc):
    ev = ", ".join(f"{k}{list(getattr(sc.events, k))}" for k in hypo.EVENT_NAMES
                   if getattr(sc.events, k))
    p, d = sc.prefill, sc.decode
    return (f"prompts {list(sc.prompt_pages)}; P pool {p.pool_pages} limit {p.intake_limit_pages}"
            f"{' truncate' if p.auto_truncate else ''}{' checksum' if p.kv_checksum else ''}"
            f" chunk {p.chunk_pages}; D pool {d.pool_pages} limit {d.intake_limit_pages}"
            f"{' truncate' if d.auto_truncate else ''}{' checksum' if d.kv_checksum else ''}"
            f"{' radix' if d.radix_cache else ''} ranks {d.ranks}"
            f"; optimistic {sc.optimistic_prefill_attempts}"
            f"; deferral {sc.deferred_release}; events {ev or 'none'}"
            + (f"; rooms {list(sc.bootstrap_rooms)} (reused after {sc.reuse_room_after})"
               if sc.shares_rooms else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="ci")
    args = ap.parse_args()
    print("| release | property | steps | scenario |")
    print("|---|---|---:|---|")
    for rel in releases.RELEASES.values():
        t = time.perf_counter()
        found = hypo.find_in_drawn(rel, properties.select([]), args.profile)
        for f in found:
            print(f"| {rel.name} | `{f.property}` | {len(f.steps)} | {describe(f.scenario)} |",
                  flush=True)
        if not found:
            print(f"| {rel.name} | none found | | |", flush=True)
        print(f"<!-- {rel.name}: {time.perf_counter() - t:.1f} s -->", flush=True)


if __name__ == "__main__":
    main()
