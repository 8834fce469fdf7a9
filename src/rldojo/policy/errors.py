"""The policy layer's user-facing error, in a module of its own so that the command line
can name it in its `except` clauses without importing torch (`rldojo.policy.models`
imports torch at the top)."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The model named in the config cannot be loaded; the message says why and what to do."""
