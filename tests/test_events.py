"""Events are a closed, typed vocabulary: named fields, one description each."""
import attrs
import pytest

from reqmodel.model import events


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
