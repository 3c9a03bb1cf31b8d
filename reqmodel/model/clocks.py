"""Which timeout can pass before which: the model's clocks.

The model has no time.  A timeout is a step the search may take at any
point its guard allows (``@action(timeout=ENV)``), which is conservative:
it lets a timeout fire before another that the code guarantees passes
first.  One ordering the code does guarantee matters to the model's
findings, and this module states it as data:

* **a bound**: something that ends, in real time, within a period after it
  starts, whatever any scheduler loop is doing.  A Mooncake transfer batch
  is one: ``batch_transfer_sync`` returns when the write completes or, at
  the transfer engine's ``MC_TRANSFER_TIMEOUT`` (30 s by default; Mooncake's
  transfer engine, ``transfer_timeout_nsec_``), returns -1 "with the batch
  still running" (mc 22:2413-2421), which the model's ``xfer_fail`` is;
* **a timer**: a deadline a scheduler loop notices when it polls after the
  deadline has passed, never before.  The deferral hold's deadline is one
  (``deadline = monotonic() + SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT``
  when decode agrees on the failure, dc 21:2783; ``now < deadline`` keeps
  holding, dc 21:2840).

A bound that started no later than a timer was armed, with a period no
longer than the timer's, has ended (its write landed, or its batch was
reported failed) before the timer can be noticed.  The model keeps, for
each held request, the writes in flight when its hold was armed
(``DecodeReq.outlasts``, ``actions.timeouts.note_hold_outlasts``); the
hold's timeout waits for them.  With ``MC_TRANSFER_TIMEOUT`` above the
deferral timeout (``options.timeouts`` in a scenario) it does not, and a
trace whose hold passes while such a write still runs says so
(``needs``).

Timing assumption: a write is in flight from the step the worker takes
its chunk (``xfer_dequeue``); the code submits the batch microseconds
later.  The bootstrap and waiting timeouts (300 s) are not ordered against
writes: a write that started before their clocks would have to outlast
them tenfold, and the model lets it (conservative)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import attrs

from reqmodel.model import releases

# Mooncake's transfer engine, not SGLang: its default, the same under every
# release (Mooncake's transfer engine Python API, "MC_TRANSFER_TIMEOUT: Sets
# the transfer timeout in seconds (default: 30)")
MC_TRANSFER_TIMEOUT = "MC_TRANSFER_TIMEOUT"
DEFERRAL_TIMEOUT = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"
ENGINE_DEFAULTS: Dict[str, float] = {MC_TRANSFER_TIMEOUT: 30.0}

# the timeouts a scenario's ``options.timeouts`` may set: SGLang's (every
# release record's ``timeouts``) and the transfer engine's
TIMEOUT_ENVS: Tuple[str, ...] = tuple(dict.fromkeys(
    [env for rel in releases.RELEASES.values() for env, _ in rel.timeouts]
    + list(ENGINE_DEFAULTS)))


def default_seconds(release, env: str) -> float:
    """Timeout ``env``'s default: the release's, or the engine's for
    ``MC_TRANSFER_TIMEOUT``."""
    if env in ENGINE_DEFAULTS:
        return ENGINE_DEFAULTS[env]
    return release.timeout_seconds(env)


def seconds(release, scenario, env: str) -> float:
    """The period of timeout ``env`` in the scenario's deployment: its
    ``options.timeouts`` entry, else its default."""
    got = dict(scenario.timeouts).get(env)
    return default_seconds(release, env) if got is None else got


def hold_outlasts_writes(release, scenario) -> bool:
    """A deferral hold cannot pass while a write that was in flight when it
    was armed still runs: ``MC_TRANSFER_TIMEOUT`` is at most the deferral
    timeout (both 30 s by default)."""
    return seconds(release, scenario, MC_TRANSFER_TIMEOUT) <= seconds(
        release, scenario, DEFERRAL_TIMEOUT)


@attrs.frozen
class Need:
    """A timing relation a trace needs: timeout ``longer`` above ``shorter``
    (each with its seconds in the scenario's deployment)."""

    longer: str
    shorter: str
    longer_s: float
    shorter_s: float
    step: int  # the trace step whose timeout needs it (1-based)

    @property
    def met(self) -> bool:
        """The scenario's settings give it."""
        return self.longer_s > self.shorter_s

    def setting(self) -> str:
        """What it needs, with the scenario's values, without the step."""
        have = (f"set here: {self.longer_s:g} s > {self.shorter_s:g} s" if self.met
                else f"here {self.longer_s:g} s and {self.shorter_s:g} s")
        return f"needs {self.longer} above {self.shorter} ({have})"

    def __str__(self) -> str:
        return f"{self.setting()[:-1]}; step {self.step})"

    def to_json(self) -> Dict:
        return {"longer": self.longer, "shorter": self.shorter, "longer_s": self.longer_s,
                "shorter_s": self.shorter_s, "step": self.step, "met": self.met}


def needs(ctx, states, steps) -> List[Need]:
    """The timing relations trace ``steps`` (with ``states``, one more than
    the steps) needs: each deferral timeout taken while a write in flight
    when its hold was armed still ran needs ``MC_TRANSFER_TIMEOUT`` above
    the deferral timeout.  Read off the states whatever the scenario's
    settings, so an untimed trace says what it would need."""
    from reqmodel.model.actions.timeouts import track_outlasts
    out: List[Need] = []
    longer = seconds(ctx.release, ctx.scenario, MC_TRANSFER_TIMEOUT)
    shorter = seconds(ctx.release, ctx.scenario, DEFERRAL_TIMEOUT)
    tracked = states[0]
    for i, step in enumerate(steps):
        if step.action == "d_deferred_timeout" and tracked.d[step.rid].outlasts:
            out.append(Need(MC_TRANSFER_TIMEOUT, DEFERRAL_TIMEOUT, longer, shorter, i + 1))
        tracked = track_outlasts(tracked, states[i + 1])
    return out

