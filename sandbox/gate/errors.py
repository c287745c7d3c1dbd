"""What the gate raises when it refuses a request.

    Refused (ValueError)   a request breaks a rule; answered 403 with the reason

Only the gate's own code raises and catches it: the caller sees the reason in Docker's error
shape (`{"message": ...}`), never a traceback.
"""

from __future__ import annotations


class Refused(ValueError):
    """Raised when a request breaks one of the gate's rules. The message is the reason, a
    sentence naming the setting (and where it sits in the body) and what is allowed; it never
    quotes an environment value or a command."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason
