"""Errors raised by tools and workspaces.

    BatonError (orchestrator.core.errors)
    └── ToolError    (RuntimeError)

`BatonError` holds the message; every argument reaches ``Exception.__init__``, so it pickles.
"""

from __future__ import annotations

from orchestrator.core.errors import BatonError


class ToolError(BatonError, RuntimeError):
    """Raised when a tool cannot do what the model asked; the message is returned to the model.

    So the message says what was wrong and what to do instead, in the model's terms.
    """
