"""A stage's reply: parsed, validated against its schema, and held to its size budget."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from workers.budget import json_chars, shrink_to_fit
from workers.errors import StageOutputError

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
MAX_ERROR_CHARS = 1_500


@functools.cache
def contract(schema: type[BaseModel]) -> str:
    """What every stage is told about its reply, after its own instruction (made once per
    schema: a JSON schema takes a while to build)."""
    return (
        "When you are done, reply with only a JSON object (no prose, no code fence) that "
        "validates against this JSON schema:\n"
        + json.dumps(schema.model_json_schema(), separators=(",", ":"))
    )


def parse(text: str, schema: type[BaseModel]) -> dict[str, Any]:
    """The reply as a validated dict.

    Raises:
        StageOutputError: the reply is empty, not JSON, or does not match the schema.
    """
    if not text.strip():
        raise StageOutputError("the reply was empty")
    match = _FENCE.match(text)
    body = match.group(1) if match else text.strip()
    try:
        return schema.model_validate_json(body).model_dump(mode="json")
    except ValidationError as exc:
        raise StageOutputError(_describe(exc, schema)) from exc


def repair_message(error: StageOutputError) -> str:
    return (
        "Your reply could not be used: "
        + error.message
        + "\nReply again with only the JSON object that matches the schema, nothing else."
    )


def _describe(exc: ValidationError, schema: type[BaseModel]) -> str:
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in err["loc"]) or "(reply)"
        problems.append(f"{where}: {err['msg']}")
    text = f"the reply does not match {schema.__name__}: " + "; ".join(problems)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


def truncate_to_budget(
    output: dict[str, Any], schema: type[BaseModel], max_chars: int
) -> dict[str, Any]:
    """Cut the output's longest strings and lists, with markers, until it fits.

    Raises:
        StageOutputError: even cut down, the output cannot fit its budget and its schema.
    """
    cut, _ = shrink_to_fit(output, max_chars)
    try:
        cut = schema.model_validate(cut).model_dump(mode="json")
    except ValidationError as exc:
        raise StageOutputError(
            f"the output is {json_chars(output)} chars, over its budget of {max_chars}, and "
            f"cutting it breaks its schema: {_describe(exc, schema)}"
        ) from exc
    if json_chars(cut) > max_chars:
        raise StageOutputError(
            f"the output is {json_chars(output)} chars and cannot be cut below its budget of "
            f"{max_chars} chars"
        )
    return cut
