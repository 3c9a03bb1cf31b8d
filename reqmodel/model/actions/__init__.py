"""The actions of the transition system.

Every action is a small named function registered with :func:`action`, its
guard given first (in the decorator) and its effect in the body.  The effect
returns the next state and the *events* the step emitted (acquisitions,
releases, sends, reads, streams), which transition properties inspect.

Each action takes ``(ctx, state, rid, arg)``: the context (release record and
scenario), the state, the request it acts on, and an optional choice (pages
to allocate, prefix hit) that ``choices`` enumerates.  The exhaustive
explorer, the Hypothesis state machine and trace replay all iterate over
``ACTIONS``; none of them knows the protocol.

Release differences live in the release record (``ctx.release``), never in an
``if release >= ...`` here.  Docstrings cite the SGLang code each action
models, per release (``a/b/c/d/e`` = lines in 0.5.19/20/21/22/23).

The sections are modules, imported below in the order the registry lists
their actions (the exhaustive engine's breadth-first order, and so which of
several shortest counterexamples it reports, follows that order):
``intake``, ``prefill``, ``transfer`` (prefill's transfer worker and KV
manager), ``decode``, ``client`` (aborts), ``timeouts``, ``ranks``
(decode's ranks deciding alone), ``handshake`` (0.5.19's handshake poll
on its own) and ``faults`` (a prefill instance dies or goes silent, decode's
heartbeat declares it lost); the KV managers'
bookkeeping is ``kvmanager``, decode's release of pages and slots (and of a
failed request's hold) ``drelease``, the page and slot pools ``dpool``,
messages in flight ``transport``, operations on one ``Req`` ``req``, and the
registry itself ``core``.
"""
from reqmodel.model.actions import (intake, prefill, transfer, decode, client, timeouts,  # noqa: F401
                                   ranks, handshake, faults)  # (registers)
from reqmodel.model.actions import drelease, kvmanager, req, transport  # noqa: F401
from reqmodel.model.actions.core import (ACTIONS, BY_NAME, CHANNEL_ARG, PRANK_ARG, RANK_ARG, Action,
                                         Ctx, Effect, Event, Step, action, apply, armed_timeouts,
                                         enabled, initial_state, successors, timeout_armed)

__all__ = ["ACTIONS", "BY_NAME", "CHANNEL_ARG", "PRANK_ARG", "RANK_ARG", "Action", "Ctx", "Effect",
           "Event", "Step", "action", "apply", "armed_timeouts", "enabled", "initial_state",
           "successors", "timeout_armed"]
