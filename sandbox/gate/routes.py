"""Which Docker API requests the gate forwards, and what it checks first.

`route(policy, method, target)` reads only the request line: it answers a `Refusal`, or a
`Route` saying which container or exec the request acts on (the proxy looks it up and checks
its labels), which body rule applies, and how the forwarded target reads once the container's
full id is known (a name or a short id is replaced by the id the gate checked, so the request
cannot reach another container that takes the name meanwhile).

Paths may start with an API version (`/v1.45/containers/create`); it is kept when forwarding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from sandbox import labels as label
from sandbox.gate.policy import (
    Body,
    GatePolicy,
    create_refusal,
    exec_refusal,
    not_a_build,
    not_a_sandbox,
    not_an_environment,
    with_runtime,
)

VERSION = re.compile(r"^(/v\d+(?:\.\d+)*)(/.*)$")
LabelRule = Callable[[dict[str, str]], str | None]


@dataclass(frozen=True)
class Refusal:
    """The request is refused, for `reason`."""

    reason: str


@dataclass(frozen=True)
class Route:
    """The request may go on once its checks pass."""

    target: Callable[[str], str]
    """The forwarded request target, given the full id of `container` (or of the exec's
    container); called with "" when the request names neither."""
    container: str | None = None
    """The container the request acts on, as the caller named it."""
    exec_id: str | None = None
    """The exec the request acts on: its container is the one checked."""
    label_rules: tuple[LabelRule, ...] = (not_a_sandbox,)
    """What the container's labels must pass."""
    body_rule: Callable[[Body], str | None] | None = None
    """Set: the JSON body is read whole and must pass it before anything is forwarded."""
    rewrite: Callable[[Body], dict[str, Any]] | None = field(default=None)
    """Set: what is forwarded instead of the body read."""


@dataclass(frozen=True)
class Call:
    """A request line, read."""

    policy: GatePolicy
    method: str
    version: str
    """`/v1.45`, or "" when the path has none."""
    parts: tuple[str, ...]
    """The path's segments after the version, unquoted."""
    query: str
    target: str
    """The request target as the caller sent it."""

    def same(self, _: str = "") -> str:
        return self.target


def unversioned(path: str) -> str:
    """`path` without its API version."""
    found = VERSION.match(path)
    return found.group(2) if found else path


def route(policy: GatePolicy, method: str, target: str) -> Refusal | Route:
    """How the gate handles `method target`; see the module's documentation."""
    split = urlsplit(target)
    found = VERSION.match(split.path)
    version, path = (found.group(1), found.group(2)) if found else ("", split.path)
    parts = tuple(unquote(part) for part in path.strip("/").split("/"))
    call = Call(policy, method, version, parts, split.query, target)
    for pattern, methods, handler in ROUTES:
        if method in methods and _matches(pattern, parts):
            return handler(call)
    return Refusal("not an API call Baton's sandboxes use")


Handler = Callable[[Call], Refusal | Route]


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """`pattern` segments: a literal, `*` (one segment), or `**` last (one or more)."""
    if pattern and pattern[-1] == "**":
        head = pattern[:-1]
        return len(parts) > len(head) and _matches(head, parts[: len(head)])
    return len(pattern) == len(parts) and all(
        want in ("*", got) for want, got in zip(pattern, parts, strict=True)
    )


def _forward(call: Call) -> Route:
    return Route(call.same)


def _on_container(call: Call) -> Route:
    """`/containers/{ref}/...`: forwarded to the checked container's id."""
    rest = "".join(f"/{quote(part, safe=':')}" for part in call.parts[2:])

    def target(container_id: str) -> str:
        path = f"{call.version}/containers/{container_id}{rest}"
        return f"{path}?{call.query}" if call.query else path

    if call.parts[2:] == ("exec",):
        return Route(target, container=call.parts[1],
                     body_rule=lambda body: exec_refusal(call.policy, body))  # fmt: skip
    return Route(target, container=call.parts[1])


def _on_exec(call: Call) -> Route:
    return Route(call.same, exec_id=call.parts[1])


def _create(call: Call) -> Route:
    return Route(
        call.same,
        body_rule=lambda body: create_refusal(call.policy, body),
        rewrite=lambda body: with_runtime(call.policy, body),
    )


def _list(call: Call) -> Refusal | Route:
    """`GET /containers/json`: only sandboxes, whatever else the caller filters on."""
    fields = parse_qs(call.query, keep_blank_values=True)
    try:
        filters = json.loads(fields.get("filters", ["{}"])[-1] or "{}")
        wanted = filters.get("label") or []
        labels = [*wanted] if isinstance(wanted, list) else [k for k, on in wanted.items() if on]
    except (ValueError, AttributeError):
        return Refusal("its filters are not Docker's JSON")
    fields["filters"] = [json.dumps({**filters, "label": [*labels, label.SANDBOX_FILTER]})]
    listed = f"{call.version}/containers/json?{urlencode(fields, doseq=True)}"
    return Route(lambda _: listed)


def _image(call: Call) -> Refusal | Route:
    """`GET /images/{name}/json` for any image; `DELETE /images/{name}` for environments."""
    if call.method == GET:
        if len(call.parts) < 3 or call.parts[-1] != "json":
            return Refusal("of the images, only one's inspection (/images/{name}/json) is read")
        return Route(call.same)
    reason = not_an_environment("/".join(call.parts[1:]))
    return Refusal(reason) if reason else Route(call.same)


def _commit(call: Call) -> Refusal | Route:
    """`POST /commit?container=…&repo=…&tag=…`: a build container, into an environment image."""
    fields = parse_qs(call.query, keep_blank_values=True)
    container = fields.get("container", [""])[-1]
    repository = f"{fields.get('repo', [''])[-1]}:{fields.get('tag', [''])[-1]}"
    reason = not_an_environment(repository)
    if reason or not container:
        return Refusal(reason or "it names no container")

    def target(container_id: str) -> str:
        query = urlencode({**fields, "container": [container_id]}, doseq=True)
        return f"{call.version}/commit?{query}"

    return Route(target, container=container, label_rules=(not_a_sandbox, not_a_build))


GET, HEAD, POST, PUT, DELETE = "GET", "HEAD", "POST", "PUT", "DELETE"
ROUTES: tuple[tuple[tuple[str, ...], tuple[str, ...], Handler], ...] = (
    (("_ping",), (GET, HEAD), _forward),
    (("version",), (GET,), _forward),
    (("info",), (GET,), _forward),
    (("images", "**"), (GET, DELETE), _image),
    (("commit",), (POST,), _commit),
    (("containers", "json"), (GET,), _list),
    (("containers", "create"), (POST,), _create),
    (("containers", "*"), (DELETE,), _on_container),
    (("containers", "*", "json"), (GET,), _on_container),
    (("containers", "*", "logs"), (GET,), _on_container),
    (("containers", "*", "archive"), (GET, HEAD, PUT), _on_container),
    (("containers", "*", "exec"), (POST,), _on_container),
    (("containers", "*", "start"), (POST,), _on_container),
    (("containers", "*", "wait"), (POST,), _on_container),
    (("containers", "*", "rename"), (POST,), _on_container),
    (("containers", "*", "kill"), (POST,), _on_container),
    (("containers", "*", "stop"), (POST,), _on_container),
    (("exec", "*", "json"), (GET,), _on_exec),
    (("exec", "*", "start"), (POST,), _on_exec),
    (("exec", "*", "resize"), (POST,), _on_exec),
)
"""Every request the gate forwards, by path segments after the version; the rest is refused."""
