"""How prefill's KV manager keeps the targets of ABORT_ACK, one value per
variant the releases have (the release record's ``ack_targets``).

With deferred release on, decode's ABORT asks prefill to acknowledge once
the room's in-flight chunks drain (``register_deferred_ack_target`` and
``_maybe_ack_drained_abort``). The releases differ in four decisions, and
each variant makes all four in one place:

- ``registers``: whether an ABORT registers a target at all;
- ``register``: the room's targets after one is registered (None: unchanged);
- ``on_drain``: who gets an ack when the room drains;
- ``acks_at_once``: whether an unregistered ABORT on a drained room is
  acknowledged at once.

A proposal can replace the record's value with another ``AckPolicy``.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import attrs

from reqmodel.model.state import Room

Target = Tuple[int, int, int]  # (decode rank, generation, origin request)


@attrs.frozen
class AckPolicy:
    """The interface; ``name`` is the variant's word in traces and notes."""

    name: str = "abstract"
    acks_at_once: bool = True

    def registers(self, gen: int, active: bool, busy: bool, generations: bool) -> bool:
        raise NotImplementedError

    def register(self, room: Room, rank: int, gen: int, r: int) -> Optional[Tuple[Target, ...]]:
        raise NotImplementedError

    def on_drain(self, room: Room) -> Dict[int, Tuple[int, int]]:
        """decode rank -> (generation, origin) of each ack sent on drain."""
        return {k: (gen, origin) for k, gen, origin in room.ack_to}


@attrs.frozen
class LastTarget(AckPolicy):
    """0.5.19/0.5.20: one target per room, overwritten by a later ABORT; an
    ABORT registers only while the room is active (cc 19:432-447)."""

    name: str = "last"

    def registers(self, gen, active, busy, generations):
        return active

    def register(self, room, rank, gen, r):
        return ((rank, gen, r),)


@attrs.frozen
class FanOut(AckPolicy):
    """0.5.21: registers if the room is active or has chunks outstanding, and
    snapshots the room's ``transfer_infos`` peers, which get an ack too
    (mc 21:2449-2522; cc 21:689-739)."""

    name: str = "fan-out"

    def registers(self, gen, active, busy, generations):
        return active or busy

    def register(self, room, rank, gen, r):
        return ((rank, gen, r),) + tuple((k, 0, r) for k in room.peers if k != rank)

    def on_drain(self, room):
        targets = super().on_drain(room)
        origin = room.ack_to[0][2]
        for k in room.peers:
            targets.setdefault(k, (0, origin))
        return targets


@attrs.frozen
class PerEndpoint(AckPolicy):
    """0.5.22+: one target per decode endpoint with its generation; every
    ABORT that carries a generation registers, none for a poisoned room, and
    nothing is acknowledged at once (cc 22:908-943)."""

    name: str = "per-endpoint"
    acks_at_once: bool = False

    def registers(self, gen, active, busy, generations):
        return gen != 0 or not generations

    def register(self, room, rank, gen, r):
        if room.poisoned:
            return None
        targets = {k: (k, g, o) for k, g, o in room.ack_to}
        targets[rank] = (rank, gen, r)
        return tuple(sorted(targets.values()))


LAST, FAN_OUT, PER_ENDPOINT = LastTarget(), FanOut(), PerEndpoint()
