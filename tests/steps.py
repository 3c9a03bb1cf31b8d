"""Shared by the tests that drive the model step by step."""
from reqmodel.model.actions import apply, initial_state


def run_steps(ctx, steps, s=None):
    """Apply ``steps`` from ``s`` (default: the initial state); each must be enabled."""
    s = initial_state(ctx.scenario) if s is None else s
    for st in steps:
        out = apply(ctx, s, st)
        assert out is not None, f"{st} not enabled"
        s = out[0]
    return s
