"""Events are a closed, typed vocabulary: named fields, one description each."""
import attrs
import pytest

from reqmodel.model import events
from reqmodel.model import releases
from reqmodel.model import scenario


@pytest.mark.parametrize("cls", sorted(events.KINDS.values(), key=lambda c: c.kind),
                         ids=lambda c: c.kind)
def test_every_event_kind_has_its_own_class_and_description(cls):
    assert cls is not events.Event and issubclass(cls, events.Event)
    assert events.KINDS[cls.kind] is cls
    assert cls.describe is not events.Event.describe, f"{cls.kind} has no description of its own"
    names = [f.name for f in attrs.fields(cls)]
    assert names[:2] == ["rid", "side"]


def test_kinds_are_unique_and_fields_are_named():
    kinds = [c.kind for c in events.Event.__subclasses__()]
    assert len(kinds) == len(set(kinds)) == len(events.KINDS)
    e = events.Read(0, "decode", (1, 2))
    assert e.foreign and e.foreign_pages == (1, 2)
    assert not events.Read(0, "decode", ()).foreign
    with pytest.raises(TypeError):
        events.Read(0, "decode")  # a missing field fails loudly
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        e.rid = 1


def test_descriptions_read_as_before():
    """The rendering the corpus notes quote."""
    assert events.Release(0, "prefill", "cache", False).describe() == (
        "prefill caches the unfinished request (maybe_cache_unfinished_req) though it holds NO KV")
    assert events.Read(1, "decode", (0,)).describe() == "attention reads FOREIGN pages [0]"
    assert events.Commit(1, "decode", 2, ((0, 0),), 1).describe() == (
        "decode commits on the Success report of r0's")
    assert events.Commit(1, "decode", 2, ((0, 1),), 1).describe() == "decode commits the transfer"



@pytest.mark.parametrize("rel,name", [("0.5.19", "incident"), ("0.5.21", "room-reuse-three"),
                                      ("0.5.19", "prefill-tp")])
def test_event_indexed_transition_properties_give_the_unindexed_verdicts(rel, name):
    """The explorer checks a property written with ``properties.every`` only
    on steps that carry one of its event classes.  Checked on every step
    instead (the same predicate behind a plain function, which the explorer
    cannot index), every verdict and every counterexample is the same."""
    from reqmodel.engines import exhaustive as explore
    from reqmodel.model import properties
    from reqmodel.model.properties import Every
    props = [p for p in properties.select([]) if not p.kind.on_graph]
    plain = [attrs.evolve(p, transition=lambda pre, step, evs, post, f=p.transition:
                          f(pre, step, evs, post))
             if isinstance(p.transition, Every) else p for p in props]
    assert sum(isinstance(p.transition, Every) for p in props) >= 10
    a = explore.explore(releases.get(rel), scenario.builtin(name), props, stop_early=False,
                        keep_graph=False)
    b = explore.explore(releases.get(rel), scenario.builtin(name), plain, stop_early=False,
                        keep_graph=False)

    def cells(ex):
        return {k: (v.verdict, v.trace and v.trace.steps) for k, v in ex.verdicts.items()}
    assert cells(a) == cells(b)
    assert sum(v.verdict == "violated" for v in a.verdicts.values()) >= 3
