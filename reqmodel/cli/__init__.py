"""The ``reqmodel`` command line (``reqmodel.cli.commands``)."""
from reqmodel.cli.commands import cli, main

__all__ = ["cli", "main"]
