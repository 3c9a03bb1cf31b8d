"""What a property is: its kind (``Kind``), its definition (``Property``),
and transition predicates over a step's events (``Every``).  The catalog of
properties is ``properties.py``."""
from __future__ import annotations

import enum
from typing import Callable, Optional, Tuple

import attrs

from reqmodel.model.actions import Ctx, Event, Step
from reqmodel.model.releases import Release
from reqmodel.model.scenario import Scenario
from reqmodel.model.state import State

class Kind(enum.StrEnum):
    """Stateright's expectations: ``always`` (safety: every reachable state
    and step is good) and ``sometimes`` (reachability: some reachable state is
    good, the guard against guards that block everything)."""

    ALWAYS = "always"
    SOMETIMES = "sometimes"
    # liveness over the whole reachable graph (notes/liveness.md), through the
    # deployment's own steps (no timeout, no step the environment chooses):
    # AG EF goal, per request: from every reachable state the goal can still be reached
    ALWAYS_POSSIBLY = "always-possibly"
    # AG EF goal through the deployment's own steps and its timeouts: no
    # reachable state leaves a request waiting where nothing, not even a
    # timeout, can end the wait
    BOUNDED = "bounded"
    # under weak fairness per scheduler step: no cycle of such steps runs
    # forever while the goal is not reached
    EVENTUALLY = "eventually"

    @property
    def on_graph(self) -> bool:
        """Decided on the whole reachable graph, not on states or steps alone."""
        return self in (Kind.ALWAYS_POSSIBLY, Kind.BOUNDED, Kind.EVENTUALLY)


WAITS = "has a client that waits"


@attrs.frozen
class Property:
    name: str
    kind: Kind = attrs.field(converter=Kind)
    ref: str  # id in the modelling reference
    text: str  # one-sentence statement for people
    state: Optional[Callable[[State], bool]] = None  # True = good state
    transition: Optional[Callable[[State, Step, Tuple[Event, ...], State], bool]] = None
    applies: Callable[[Release, Scenario], bool] = lambda rel, sc: True
    # graph kinds: the good state for request r (always-possibly: it can
    # still be reached; eventually: no fair cycle avoids it)
    goal: Optional[Callable[[State, int], bool]] = None
    pending: Optional[Callable[[State, int], bool]] = None  # request r waits for its goal
    # what an engine that sees no graph checks instead, and why the rest is
    # out of its reach (always-possibly: its deadlock form)
    partial: Optional[Callable[[Ctx, State], bool]] = None
    partial_note: str = ""  # the engine adds how to check the property whole
    aliases: Tuple[str, ...] = ()  # older names that still select it
    # which of the write-up's four acceptance gates the property checks
    # (admission, transfer-read, lifetime; pool-context is arithmetic on the
    # deployment, reqmodel/audit/deployment.py), and what its violation makes
    # of that gate in ``reqmodel audit``: "fail" where the violation itself
    # harms (another request's KV read, a crash, a rejected request served, a
    # good request failed), "warn" where it holds something until a timeout,
    # leaks, wastes work, or is a step whose harm a "fail" property states
    gate: str = attrs.field(default="", validator=attrs.validators.in_(
        ("", "admission", "transfer-read", "lifetime")))
    on_violation: str = attrs.field(default="fail", validator=attrs.validators.in_(
        ("fail", "warn")))
    # a graph property's counterexample: what is wrong with request r from
    # the last state on (after "r<n> "), for people
    stuck: str = WAITS

    def holds_in(self, s: State) -> bool:
        return self.state(s) if self.state else True

    def state_check(self, ctx: Ctx) -> Optional[Callable[[State], bool]]:
        """The state predicate an engine checks in every state: the
        property's own, or, for a graph property, its partial form (bound
        to the release and scenario, since it asks which steps are enabled)."""
        if self.state is not None:
            return self.state
        if self.partial is not None:
            return lambda s: self.partial(ctx, s)
        return None

    def holds_on(self, pre: State, step: Step, evs, post: State) -> bool:
        return self.transition(pre, step, evs, post) if self.transition else True

    def hit(self, pre: State, step: Step, evs, post: State) -> bool:
        """The step breaks this safety property, or reaches this reachability
        property's good state."""
        if self.kind is Kind.SOMETIMES:
            return self.holds_in(post)
        return not self.holds_in(post) or not self.holds_on(pre, step, evs, post)


@attrs.frozen
class Every:
    """A transition predicate that asks something of each of the step's events
    of some classes: ``check(event, pre, post)`` for every such event.  A step
    without one holds trivially, so an engine may skip the check on it (the
    explorer indexes transition properties by ``events``)."""

    events: Tuple[type, ...]
    check: Callable[[Event, State, State], bool]

    def __call__(self, pre: State, step: Step, evs, post: State) -> bool:
        return all(self.check(e, pre, post) for e in evs if isinstance(e, self.events))


def every(events, check) -> Every:
    return Every(events if isinstance(events, tuple) else (events,), check)
