"""Thought signatures: issued on replies, checked on the current turn, read back as the step.

Gemini 3 models attach an opaque `thoughtSignature` (base64 in JSON) to their replies and
require it back, unchanged, on the function calls of the current turn. The fake's signature is
the reply's step (4 bytes, big-endian) followed by an HMAC-SHA256, under a secret each server
draws at start, of the model, the agent, the step and what the reply said. A client cannot
forge one, and the server verifies one without remembering anything; it can also tell which
step a conversation is at from the newest model content whose signature it verifies, however
much of the conversation before it the client left out.

Where a signature goes, as the real API puts it:

* a reply with function calls: on its first `functionCall` part only (parallel calls share it),
  bound to that call's name and arguments;
* any other reply: on its last part, bound to the reply's text (its non-thought text parts
  joined). Those are never checked, only read for the step.

The check (`problem`) covers the current turn only: the contents after the newest user content
holding anything but `functionResponse` parts. Every model content there with function calls
must carry, on its first `functionCall` part, a signature this server issued for exactly that
call; earlier turns are not checked. Both base64 alphabets are accepted (google-genai sends the
bytes back URL-safe), with or without padding, and fields by their proto names too
(`thought_signature`, `function_call`), as the real API's JSON parser takes them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from testkit.gemini import wire
from testkit.gemini.tokens import compact_json

FIELD = wire.SIGNATURE_FIELD
STEP_BYTES = 4
"""The signature's leading bytes: the step it was issued for, big-endian."""

Part = Mapping[str, Any]
Content = Mapping[str, Any]


class Signer:
    """Issues and verifies the signatures of one server (one secret)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(
        self, parts: list[dict[str, Any]], *, model: str, agent: str, step: int
    ) -> list[dict[str, Any]]:
        """`parts` with a signature on the part that carries it (new part objects)."""
        signed = [dict(part) for part in parts]
        holder = _holder(signed)
        if holder is not None:
            mac = self._mac(model, agent, step, signed)
            raw = step.to_bytes(STEP_BYTES, "big") + mac
            signed[holder][FIELD] = base64.b64encode(raw).decode("ascii")
        return signed

    def verified_step(self, content: Content, *, model: str, agent: str) -> int | None:
        """The step a model content's signature was issued for; None when it has none or one
        this server did not issue for that content."""
        parts = _parts(content)
        holder = _holder(parts, signed_only=True)
        if holder is None:
            return None
        raw = _decode(wire.field(parts[holder], FIELD))
        if raw is None or len(raw) <= STEP_BYTES:
            return None
        step = int.from_bytes(raw[:STEP_BYTES], "big")
        expected = self._mac(model, agent, step, parts)
        return step if hmac.compare_digest(raw[STEP_BYTES:], expected) else None

    def step_of(self, body: Mapping[str, Any], *, model: str, agent: str) -> int:
        """The step a request is at: one past the newest model content with a signature this
        server verifies, plus the model contents after it; without one, the number of model
        contents."""
        models = [c for c in _contents(body) if c.get("role") == "model"]
        for after, content in enumerate(reversed(models)):
            step = self.verified_step(content, model=model, agent=agent)
            if step is not None:
                return step + 1 + after
        return len(models)

    def problem(self, body: Mapping[str, Any], *, model: str, agent: str) -> str | None:
        """What the real API would refuse about the current turn's signatures, or None."""
        contents = _contents(body)
        start = current_turn_start(contents)
        for position, content in enumerate(contents[start:], start=start + 1):
            parts = _parts(content)
            call = _first_call(parts)
            if content.get("role") != "model" or call is None:
                continue
            if wire.field(parts[call], FIELD) is None:
                name = str(wire.field(parts[call], "functionCall").get("name"))
                return wire.MISSING_SIGNATURE.format(name=name, position=position)
            if self.verified_step(content, model=model, agent=agent) is None:
                return wire.CORRUPTED_SIGNATURE
        return None

    def _mac(self, model: str, agent: str, step: int, parts: Sequence[Part]) -> bytes:
        message = compact_json([model, agent, step, _bound(parts)]).encode()
        return hmac.new(self._secret, message, hashlib.sha256).digest()


def current_turn_start(contents: Sequence[Content]) -> int:
    """Index of the first content of the current turn: the one after the newest user content
    holding anything but function responses (0 when there is none)."""
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        if content.get("role", "user") == "user" and any(
            wire.field(part, "functionResponse") is None for part in _parts(content)
        ):
            return index + 1
    return 0


def _bound(parts: Sequence[Part]) -> Any:
    """What a signature is bound to: the first call's name and arguments, else the text."""
    call = _first_call(parts)
    if call is not None:
        function = wire.field(parts[call], "functionCall")
        return {"name": function.get("name"), "args": _canonical(function.get("args") or {})}
    return "".join(str(p.get("text") or "") for p in parts if not p.get("thought"))


def _canonical(value: Any) -> Any:
    """`value` with its keys sorted, so that a client's key order does not matter."""
    if isinstance(value, dict):
        return {key: _canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def _holder(parts: Sequence[Part], *, signed_only: bool = False) -> int | None:
    """Index of the part that carries the signature: the first function call, else the last
    part (when reading, the last part that has one)."""
    call = _first_call(parts)
    if call is not None:
        return call
    candidates = [
        i for i, p in enumerate(parts) if not signed_only or wire.field(p, FIELD) is not None
    ]
    return candidates[-1] if candidates else None


def _first_call(parts: Sequence[Part]) -> int | None:
    calls = (i for i, p in enumerate(parts) if isinstance(wire.field(p, "functionCall"), dict))
    return next(calls, None)


def _decode(signature: Any) -> bytes | None:
    if not isinstance(signature, str):
        return None
    text = signature.strip().replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _contents(body: Mapping[str, Any]) -> list[Content]:
    return [c for c in body.get("contents") or [] if isinstance(c, dict)]


def _parts(content: Content) -> list[Part]:
    return [p for p in content.get("parts") or [] if isinstance(p, dict)]
