"""The proposal-author API's old import path, kept as an alias: proposal
files written before the package layout import ``reqmodel.proposal``; new ones
import ``reqmodel.proposals``."""
import sys

from reqmodel.proposals import proposal as _proposal

sys.modules[__name__] = _proposal
