"""Every use of Hypothesis's private API in one place.

The engine needs three things Hypothesis does not offer publicly:

- drawing a rule among the *enabled* ones in one draw (a ``RuleStrategy``
  subclass installed as the machine's ``_rules_strategy``, reading each rule's
  ``arguments_strategies``);
- turning off constant injection (``HypothesisProvider._maybe_draw_constant``,
  6.1xx), without which a derandomized run depends on which modules the
  process imported first.

``missing()`` lists what the installed Hypothesis lacks of these, and
``tests/test_hypo.py`` requires it to be empty, so a Hypothesis upgrade that
moves one of them fails there, by name, rather than deep in a run.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List

from hypothesis.internal.conjecture import providers as _providers
from hypothesis.stateful import RuleBasedStateMachine, RuleStrategy

__all__ = ["RuleStrategy", "install_rule_strategy", "rule_arguments", "no_constant_injection",
           "missing"]


def install_rule_strategy(machine: RuleBasedStateMachine, strategy: RuleStrategy) -> None:
    """Make ``strategy`` the machine's rule strategy."""
    machine._rules_strategy = strategy


def rule_arguments(rule) -> Dict:
    """A rule's argument strategies, by name."""
    return rule.arguments_strategies


@contextlib.contextmanager
def no_constant_injection():
    """Hypothesis (6.1xx) mixes into its draws the literals it finds in the
    project's modules loaded so far (``providers._get_local_constants``);
    inside this block it does not."""
    provider = getattr(_providers, "HypothesisProvider", None)
    original = getattr(provider, "_maybe_draw_constant", None)
    if original is None:  # a Hypothesis without constant injection
        yield
        return
    provider._maybe_draw_constant = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        provider._maybe_draw_constant = original


def missing() -> List[str]:
    """The private names this module relies on that the installed Hypothesis lacks."""
    from hypothesis.stateful import rule

    class Probe(RuleBasedStateMachine):
        @rule()
        def step(self):
            pass

    out = []
    if not hasattr(RuleStrategy, "do_draw"):
        out.append("stateful.RuleStrategy.do_draw")
    machine = Probe()
    if not hasattr(machine, "_rules_strategy"):
        out.append("RuleBasedStateMachine._rules_strategy")
    rules = getattr(machine._rules_strategy, "rules", None) if hasattr(machine, "_rules_strategy") else None
    if not rules or not all(hasattr(r, "arguments_strategies") for r in rules):
        out.append("stateful.Rule.arguments_strategies")
    provider = getattr(_providers, "HypothesisProvider", None)
    if provider is None:
        out.append("conjecture.providers.HypothesisProvider")
    elif not hasattr(provider, "_maybe_draw_constant"):
        out.append("HypothesisProvider._maybe_draw_constant")
    return out
