"""The action catalog reads like a specification and has no dead actions."""
import re

import pytest

from reqmodel.model import actions
from reqmodel.model import releases
from reqmodel.model import scenario

CITATION = re.compile(r"\b(pf|dc|sch|sb|cc|mc|ut|memc|env|bc)\b[ \w/]*\d+[:/-]\d+|\b(pf|dc|sch|sb|cc|mc|ut|memc|env|bc) \d+(/\d+)+")


@pytest.mark.parametrize("a", actions.ACTIONS, ids=lambda a: a.name)
def test_every_action_has_a_cited_docstring(a):
    assert a.doc, a.name
    assert CITATION.search(a.doc), f"{a.name} cites no SGLang file:line"


def test_every_release_cites_its_guard_points():
    for rel in releases.RELEASES.values():
        for gp in ("prefill_door", "decode_door", "final_result", "middle_result",
                   "inflight_success", "prealloc_scan", "commit_check"):
            assert gp in rel.cites, (rel.name, gp)
            assert getattr(rel, gp).__doc__


def test_no_dead_action(explored):
    """Every action fires on some built-in scenario and release (the
    explorations are the ones the corpus and verdict checks use)."""
    fired = set()
    for name in scenario.builtin_names():
        for rel in releases.NAMES:
            fired |= explored(rel, name).fired
    assert set(actions.BY_NAME) - fired == set()


def test_guards_do_not_mutate_and_effects_are_pure():
    """Effects return new states; the state they read is unchanged (frozen)."""
    sc = scenario.builtin("incident")
    ctx = actions.Ctx(releases.get("0.5.19"), sc)
    s = actions.initial_state(sc)
    before = hash(s)
    list(actions.successors(ctx, s))
    assert hash(s) == before


def test_traceability_table_lists_exactly_the_actions():
    import pathlib
    import re as _re
    text = (pathlib.Path(__file__).parent.parent / "notes" / "traceability.md").read_text()
    section = text.split("## Actions", 1)[1].split("##", 1)[0]
    listed = set(_re.findall(r"^\| `(\w+)` \|", section, flags=_re.M))
    assert listed == set(actions.BY_NAME)


def test_no_dead_event_kind(explored):
    """Every event kind is emitted on some built-in scenario and release: a
    kind that no action emits is a property that reads nothing."""
    from reqmodel.model import events
    emitted = set()
    for name in scenario.builtin_names():
        for rel in releases.NAMES:
            emitted |= explored(rel, name).emitted
    assert set(events.KINDS) - emitted == set()
