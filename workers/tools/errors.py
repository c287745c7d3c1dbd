"""Errors raised by tools and workspaces.

    BatonError (orchestrator.errors)
    └── ToolError    (RuntimeError)

Every class passes all of its arguments to ``super().__init__`` so that it pickles.
"""

from __future__ import annotations

from orchestrator.errors import BatonError


class ToolError(BatonError, RuntimeError):
    """Raised when a tool cannot do what the model asked; the message is returned to the model.

    So the message says what was wrong and what to do instead, in the model's terms.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
