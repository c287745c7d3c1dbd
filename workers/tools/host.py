"""Host tools: a typed Python function by import path, as an ADK `FunctionTool`.

The function runs in the worker process (a plain `def` in a thread of its own, an `async def`
on the stage's loop), for calls to outside services. The model sees only the parameters it
fills: the tool is a new function whose signature and annotations are those parameters, with
the function's docstring (or the declaration's description), so ADK declares exactly that and
the stage's `ToolGuard` checks the model's arguments against exactly that. Baton adds the
declared settings, the secrets read from the worker's environment and, for a `ToolModel`
parameter, the stage's model client.

What comes back is the model's to read: the function's return value made JSON-ready, or, when
it raises or runs past its `timeout_s`, `{"error": ...}` naming what happened, so the model can
try another way and the stage goes on. Both lose every secret value first. Two kinds of
exception are not the tool's to answer and end the tool call as they would end the stage:
Baton's own `ExecutionError` (a cancelled run, a 429 of the tool's model call) and Celery's
soft time limit. A thread still running past the timeout is left to finish on its own: Python
cannot stop it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from celery.exceptions import SoftTimeLimitExceeded
from google.adk.tools.function_tool import FunctionTool
from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from orchestrator.core.facts import Fact, Publication
from orchestrator.core.hostfunction import HostSignature, host_signature
from orchestrator.core.tools import HostTool, ToolModel, ToolRun
from workers.errors import ExecutionError, StageError
from workers.tools.secrets import Secrets

logger = logging.getLogger(__name__)

T = TypeVar("T")

PASSED_THROUGH: tuple[type[BaseException], ...] = (ExecutionError, SoftTimeLimitExceeded)
"""Exceptions a host tool's call does not turn into a tool error: they end the stage."""


def host_tool(
    name: str,
    declaration: HostTool,
    *,
    stage: str,
    secrets: Secrets,
    model: Callable[[], ToolModel] | None = None,
    environ: Mapping[str, str] | None = None,
    run: ToolRun | None = None,
    record: Callable[[Fact, Any], None] | None = None,
) -> FunctionTool:
    """The tool `name` of `stage`: the declaration's function with its settings, `secrets`,
    its variables of `environ` and (if it asks) a model from `model` and the `run` bound. A
    `Publication` it returns is given to `record` as the facts of where the stage's result went.

    Raises:
        StageError: the function cannot be used (it no longer imports, say), it asks for a
            model or the run and none is given, or a variable it needs is not set.
    """
    try:
        signature = host_signature(declaration)
    except ValueError as exc:
        raise StageError(f"tool {name!r} of stage {stage!r} cannot run: {exc}") from exc
    bound = _bound(name, stage, signature, secrets, environ or {})
    if signature.model_client is not None:
        bound[signature.model_client] = _given(model, "a model", name, stage)()
    if signature.run is not None:
        bound[signature.run] = _given(run, "the run", name, stage)
    function, timeout_s = signature.function, declaration.timeout_s

    async def call(**arguments: Any) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                given = {**arguments, **bound}  # the model can never replace a bound value
                if inspect.iscoroutinefunction(function):
                    result = await function(**given)
                else:
                    result = await asyncio.to_thread(function, **given)
        except PASSED_THROUGH:
            raise
        except Exception as exc:  # the tool's own failure: the model reads it and goes on
            if isinstance(exc, TimeoutError) and deadline.expired():
                logger.info("host tool %s of %s ran past %g s", name, stage, timeout_s)
                return {"error": f"{name} did not finish within {timeout_s:g} s"}
            logger.info("host tool %s of %s raised %s", name, stage, type(exc).__name__)
            said = str(exc) or "(no message)"
            return {"error": secrets.redact(f"{name} failed: {type(exc).__name__}: {said}")}
        _record_publication(result, record, secrets)
        ready = to_jsonable_python(result, fallback=str)
        return secrets.redact(ready if isinstance(ready, dict) else {"result": ready})

    return FunctionTool(_declared_as(call, name, signature.parameters, signature.returns,
                                     signature.description))  # fmt: skip


def _given(value: T | None, what: str, name: str, stage: str) -> T:
    if value is None:
        raise StageError(f"tool {name!r} of stage {stage!r} asks for {what}; none is given")
    return value


def _bound(
    name: str, stage: str, signature: HostSignature, secrets: Secrets, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The values Baton gives the function's own parameters: settings, secrets and the
    environment's variables (one not set leaves the parameter's default)."""
    bound: dict[str, Any] = dict(signature.settings)
    for parameter, variable in signature.secrets.items():
        value = secrets.value(variable)
        bound[parameter] = SecretStr(value) if parameter in signature.secret_strs else value
    for parameter, variable in signature.environment.items():
        if environ.get(variable):
            bound[parameter] = environ[variable]
        elif parameter in signature.required_environment:
            raise StageError(
                f"tool {name!r} of stage {stage!r} needs {variable} set in the worker's environment"
            )
    return bound


def _record_publication(
    result: Any, record: Callable[[Fact, Any], None] | None, secrets: Secrets
) -> None:
    """Where a host tool published, if its `result` is a `Publication`, as the facts Baton
    keeps (without any secret value)."""
    if not isinstance(result, Publication) or record is None:
        return
    record(Fact.PUBLISHED_URL, secrets.redact(result.url))


def _declared_as(
    call: Callable[..., Any],
    name: str,
    parameters: tuple[inspect.Parameter, ...],
    returns: Any,
    description: str,
) -> Callable[..., Any]:
    """`call`, made to look to ADK, the guard and the model like a function `name` with only
    `parameters`: its signature, annotations, name and docstring replaced (it has no
    `__wrapped__`, so nothing finds the function behind it)."""
    keyword_only = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters]
    call.__signature__ = inspect.Signature(keyword_only, return_annotation=returns)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    call.__name__ = call.__qualname__ = name
    call.__doc__ = description
    return call
