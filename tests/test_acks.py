"""The ABORT/ABORT_ACK control plane across decode ranks (issue #3).

Each release's ack rule is data on its record; these tests flip one field at
a time and check that the verdict of ``drain-ack-reaches-every-rank`` follows
the mechanism the field names, so a rule that stopped being read would fail.
"""
import attrs
import pytest

from reqmodel.engines import exhaustive as explore
from reqmodel.model import properties
from reqmodel.model import releases
from reqmodel.model import scenario
from reqmodel.model.scenario import from_dict
from reqmodel.model import ackpolicy

DRAIN = properties.CATALOG["drain-ack-reaches-every-rank"]
RELEASED = properties.CATALOG["drain-ack-releases-hold"]


def two_ranks(events):
    return from_dict({
        "name": "two-ranks", "prompt_pages": [1],
        "prefill": {"pool_pages": 1}, "decode": {"pool_pages": 1, "ranks": 2},
        "options": {"deferred_release": True}, "events": events,
    })


CLIENT_ABORT = two_ranks({"client_abort": [0]})
WITH_TIMEOUTS = scenario.builtin("two-rank-abort")


def verdict(rel, sc, prop=DRAIN):
    ex = explore.explore(rel, sc, (prop,), stop_early=False, keep_graph=False)
    v = ex.verdicts[prop.name]
    return v.verdict, v.trace_length


def test_per_endpoint_targets_reach_every_rank():
    assert verdict(releases.get("0.5.22"), WITH_TIMEOUTS)[0] == "holds"
    reached, length = verdict(releases.get("0.5.22"), WITH_TIMEOUTS, RELEASED)
    assert reached == "holds" and length == 11  # "holds" = reached, for a reachability property


@pytest.mark.parametrize("rule", [ackpolicy.LAST, ackpolicy.FAN_OUT], ids=lambda p: p.name)
def test_weaker_target_rules_strand_a_rank(rule):
    rel = attrs.evolve(releases.get("0.5.22"), ack_targets=rule, new_room_drops_acks=False,
                       ack_generations=False, poison_failed_rooms=False)
    assert verdict(rel, CLIENT_ABORT)[0] == "violated"


def test_clear_dropping_the_target_strands_the_rank():
    # 0.5.19/0.5.20 clear() pops the target while a dequeued chunk's write is
    # still in flight (outstanding), so its completion finds no one to ack
    rel = releases.get("0.5.19")
    assert verdict(rel, CLIENT_ABORT) == ("violated", 16)
    keep = attrs.evolve(releases.get("0.5.20"), clear_drops_ack_target=False,
                        ack_targets=ackpolicy.PER_ENDPOINT)
    assert verdict(keep, CLIENT_ABORT)[0] == "holds"


def test_waiting_timeout_that_never_arms_drops_the_ack():
    # 0.5.19's _check_waiting_timeout sends ABORT without arming the tracker
    one_rank = from_dict({
        "name": "one-rank", "prompt_pages": [1],
        "prefill": {"pool_pages": 1}, "decode": {"pool_pages": 1},
        "options": {"deferred_release": True}, "events": {"timeouts": [0]},
    })
    rel = releases.get("0.5.19")
    assert verdict(rel, one_rank) == ("violated", 8)
    armed = attrs.evolve(rel, arm_before_send=True, clear_drops_ack_target=False,
                         ack_targets=ackpolicy.PER_ENDPOINT)
    assert verdict(armed, one_rank)[0] == "holds"


def test_deferral_off_holds_nothing():
    sc = attrs.evolve(WITH_TIMEOUTS, deferred_release=False)
    for name in releases.NAMES:
        assert verdict(releases.get(name), sc)[0] == "holds"
        assert not RELEASED.applies(releases.get(name), sc)


def test_ranks_are_bounded_for_exhaustive_search():
    with pytest.raises(scenario.ScenarioError, match="ranks must be 1..2"):
        from_dict({"name": "x", "prompt_pages": [1], "prefill": {"pool_pages": 1},
                   "decode": {"pool_pages": 1, "ranks": 3}})


def test_each_ack_policy_decides_in_one_place():
    """The three variants the releases have, as values: which ABORTs register
    a target, and whether an unregistered one on a drained room is acked."""
    from reqmodel.model.state import Room
    last, fan, per = ackpolicy.LAST, ackpolicy.FAN_OUT, ackpolicy.PER_ENDPOINT
    assert [releases.get(r).ack_targets for r in releases.NAMES] == [last, last, fan, per, per]
    # an inactive room with a chunk outstanding: only 0.5.21's rule registers
    assert (last.registers(0, False, True, False), fan.registers(0, False, True, False)) == (False, True)
    # 0.5.22+: a generation registers whatever the room's state; no ack at once
    assert per.registers(3, False, False, True) and not per.acks_at_once
    room = Room(ack_to=((0, 1, 0),), peers=(0, 1))
    assert last.register(room, 1, 0, 2) == ((1, 0, 2),)
    assert fan.register(room, 1, 0, 2) == ((1, 0, 2), (0, 0, 2))
    assert per.register(room, 1, 2, 2) == ((0, 1, 0), (1, 2, 2))
    assert per.register(attrs.evolve(room, poisoned=True), 1, 2, 2) is None
    assert fan.on_drain(room) == {0: (1, 0), 1: (0, 0)}
    assert last.on_drain(room) == {0: (1, 0)}
