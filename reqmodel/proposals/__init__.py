"""Guard proposals, the guard check and the mutants.

A proposal file imports what it needs from here (``from reqmodel.proposals
import is_unadmitted_reject, RETIRE_CLEANUP_FULL``); ``reqmodel.proposals.proposal``
loads and validates proposals, ``guard_check`` compares one against its base
release, and ``mutants`` holds deliberately wrong release records."""
from reqmodel.proposals.proposal import (ABORT_400, ABORT_500, DROP, FINISH_ABORT, FINISH_LENGTH,
                                         LENGTH, REQUEUE, RETIRE, RETIRE_CLEANUP_FULL, SEND, Finish,
                                         finished, is_aborted, is_unadmitted_reject)

__all__ = ["ABORT_400", "ABORT_500", "DROP", "FINISH_ABORT", "FINISH_LENGTH", "LENGTH", "REQUEUE",
           "RETIRE", "RETIRE_CLEANUP_FULL", "SEND", "Finish", "finished", "is_aborted",
           "is_unadmitted_reject"]
