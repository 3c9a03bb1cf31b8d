"""Shared by the tests that drive the model step by step."""
from reqmodel.model.actions import Step, apply, initial_state

# request 0 (two pages) transferred, answered by prefill and decoded once
RUNNING = (
    Step("p_intake", 0), Step("d_intake", 0), Step("p_door", 0), Step("d_door", 0),
    Step("d_prealloc", 0, (0, (0, 1))), Step("p_recv_metadata", 0),
    Step("p_pop_bootstrapped", 0), Step("p_forward", 0), Step("p_result", 0),
    Step("xfer_dequeue", 0), Step("xfer_write", 0), Step("p_inflight", 0),
    Step("d_recv_status", 0), Step("d_transferred", 0), Step("d_attend", 0))


def run_steps(ctx, steps, s=None):
    """Apply ``steps`` from ``s`` (default: the initial state); each must be enabled."""
    s = initial_state(ctx.scenario) if s is None else s
    for st in steps:
        out = apply(ctx, s, st)
        assert out is not None, f"{st} not enabled"
        s = out[0]
    return s
