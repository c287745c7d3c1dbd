"""Which Docker API requests the gate forwards, and what it checks first.

`route(policy, method, target, build_socket=...)` reads only the request line: it answers a
`Refusal`, or a `Route` saying which container or exec the request acts on (the proxy looks
it up and checks its labels, `policy.touch_refusal`), how its body is rebuilt (or that it must
have none), and the target it is forwarded to: written again from the parts the gate read, the
query's checked parameters only (`query.py`), and a container's full id in place of the name
or short id the caller gave (so the request cannot reach another container that takes the name
meanwhile).

A path may start with an API version (`/v1.41/containers/create`), kept when forwarding; one
below `MIN_API_VERSION` is refused, since dockerd reads old versions differently (below 1.24 a
start's body replaces the container's whole HostConfig; below 1.40 IPC is shareable by default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from sandbox import labels as label
from sandbox.gate import rules
from sandbox.gate.errors import Refused
from sandbox.gate.lookup import Container
from sandbox.gate.policy import GatePolicy, is_build, not_an_environment
from sandbox.gate.query import Param, false_flag, flag, ignored, integer, matching, read, text

VERSION = re.compile(r"v(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})")
"""An API version as dockerd writes it (`v1.41`); other spellings (`v01.41`) are refused."""
VERSION_LIKE = re.compile(r"v[0-9.]+")
"""What dockerd's router takes for a version."""
MIN_API_VERSION = (1, 41)
"""The oldest API version the gate forwards: dockerd 20.10's own, which docker-py negotiates."""
JSON = "application/json"
TAR = "application/x-tar"

Rebuild = Callable[[bytes, "Container | None"], bytes]
"""A body's check: the bytes forwarded instead of it, given the container the request acts on;
`Refused` when it breaks a rule."""


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
    build_only: bool = False
    """The container must be a build container (a commit)."""
    body: Rebuild | None = None
    """Set: the body is JSON, read whole and forwarded as this rebuilds it. Unset (and not
    `streamed`): the request must have no body."""
    streamed: bool = False
    """The body is an archive to unpack at `archive_path`: spooled (bounded), checked member by
    member (`archive.py`), then forwarded."""
    archive_path: str = ""
    """Where an archive is unpacked in the container (the query's `path`)."""
    content_type: str | None = None
    """The Content-Type forwarded with the body (the caller's is never forwarded)."""
    upgrade: bool = False
    """The caller may ask to upgrade the connection (an exec's stream)."""
    hides_builds: bool = False
    """The answer, a container list, is forwarded without build containers."""


@dataclass(frozen=True)
class Call:
    """A request line, read."""

    policy: GatePolicy
    method: str
    version: str
    """`/v1.41`, or "" when the path has none."""
    parts: tuple[str, ...]
    """The path's segments after the version, unquoted."""
    query: dict[str, str]
    """The query's checked parameters, as forwarded."""
    build_socket: bool
    owner: str | None = None
    """The `baton.owner` of a container created on this connection (`route`)."""

    def path(self, parts: tuple[str, ...] | None = None) -> str:
        """The target for `parts` (default: the request's), with the checked query."""
        written = "/".join(quote(part, safe=":@") for part in parts or self.parts)
        path = f"{self.version}/{written}"
        return f"{path}?{urlencode(self.query)}" if self.query else path

    def same(self, _: str = "") -> str:
        return self.path()


def unversioned(target: str) -> str:
    """The path of `target` without its API version, as a refusal names it."""
    path = urlsplit(target).path
    head, _, rest = path[1:].partition("/")
    return f"/{rest}" if VERSION_LIKE.fullmatch(head) else path


def route(
    policy: GatePolicy, method: str, target: str, *, build_socket: bool, owner: str | None = None
) -> Refusal | Route:
    """How the gate handles `method target` on a socket; see the module's documentation.
    `owner`: the `baton.owner` a container created on this connection carries, whatever the
    caller's labels say (None: it carries none)."""
    try:
        version, parts, raw_query = _split(target)
        for pattern, methods, params, handler in ROUTES:
            if method in methods and _matches(pattern, parts):
                query = read(raw_query, params)
                call = Call(policy, method, version, parts, query, build_socket, owner)
                return handler(call)
    except Refused as refused:
        return Refusal(refused.reason)
    return Refusal("not an API call Baton's sandboxes use")


def _split(target: str) -> tuple[str, tuple[str, ...], str]:
    """The version, the unquoted segments and the raw query of a request target."""
    split = urlsplit(target)
    if not target.startswith("/") or split.fragment or "#" in target:
        raise Refused("its target is not a plain path")
    segments = split.path[1:].split("/")
    version = ""
    if segments and VERSION_LIKE.fullmatch(segments[0]):
        found = VERSION.fullmatch(segments[0])
        if found is None or (int(found.group(1)), int(found.group(2))) < MIN_API_VERSION:
            least = ".".join(map(str, MIN_API_VERSION))
            raise Refused(f"API version {segments[0][:12]!r}: the gate speaks v{least} or later")
        version, segments = f"/{segments[0]}", segments[1:]
    parts = tuple(unquote(segment) for segment in segments)
    if any(part in ("", ".", "..") or "/" in part for part in parts):
        raise Refused("its path has an empty, '.', '..' or encoded '/' segment")
    return version, parts, split.query


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """`pattern` segments: a literal, `*` (one segment), or `**` last (one or more)."""
    if pattern and pattern[-1] == "**":
        head = pattern[:-1]
        return len(parts) > len(head) and _matches(head, parts[: len(head)])
    return len(pattern) == len(parts) and all(
        want in ("*", got) for want, got in zip(pattern, parts, strict=True)
    )


# -- handlers ---------------------------------------------------------------------------------


def _forward(call: Call) -> Route:
    return Route(call.same)


def _on_container(call: Call) -> Route:
    """`/containers/{ref}/...`: forwarded to the checked container's id."""

    def target(container_id: str) -> str:
        return call.path((call.parts[0], container_id, *call.parts[2:]))

    ref = call.parts[1]
    if call.parts[2:] == ("exec",):
        return Route(target, container=ref, body=_exec_create, content_type=JSON)
    if call.parts[2:] == ("archive",) and call.method == PUT:
        return Route(target, container=ref, streamed=True, content_type=TAR,
                     archive_path=call.query.get("path", ""))  # fmt: skip
    return Route(target, container=ref)


def _exec_create(raw: bytes, found: Container | None) -> bytes:
    assert found is not None
    return rules.exec_create(raw, container_user=found.user, in_build=is_build(found.labels))


def _on_exec(call: Call) -> Route:
    if call.parts[2] == "start":
        return Route(call.same, exec_id=call.parts[1], body=lambda raw, _: rules.exec_start(raw),
                     content_type=JSON, upgrade=True)  # fmt: skip
    return Route(call.same, exec_id=call.parts[1])


def _create(call: Call) -> Route:
    def rebuild(raw: bytes, _: Container | None) -> bytes:
        return rules.create(call.policy, raw, build_socket=call.build_socket, owner=call.owner)

    return Route(call.same, body=rebuild, content_type=JSON)


def _list(call: Call) -> Refusal | Route:
    """`GET /containers/json`: only sandboxes, whatever else the caller filters on; through the
    ordinary socket, no build container either."""
    try:
        filters = json.loads(call.query.get("filters") or "{}")
    except ValueError:
        filters = None
    wanted = filters.get("label") or [] if isinstance(filters, dict) else None
    if isinstance(wanted, dict):
        wanted = [name for name, on in wanted.items() if on is True]
    if not isinstance(wanted, list) or not all(isinstance(name, str) for name in wanted):
        return Refusal('its filters are not Docker\'s JSON ({"label": ["key=value", …]})')
    filters = {**filters, "label": [*wanted, label.SANDBOX_FILTER]}
    query = {**call.query, "filters": json.dumps(filters)}
    listed = Call(call.policy, call.method, call.version, call.parts, query, call.build_socket,
                  call.owner)  # fmt: skip
    return Route(listed.same, hides_builds=not call.build_socket)


def _image(call: Call) -> Refusal | Route:
    """`GET /images/{name}/json` for any image; `DELETE /images/{name}` for environments."""
    if call.method == GET:
        if len(call.parts) < 3 or call.parts[-1] != "json":
            return Refusal("of the images, only one's inspection (/images/{name}/json) is read")
        return Route(call.same)
    reason = not_an_environment("/".join(call.parts[1:]))
    return Refusal(reason) if reason else Route(call.same)


def _commit(call: Call) -> Refusal | Route:
    """`POST /commit?container=…&repo=…&tag=…`: a build container into an environment image,
    through the build socket only."""
    if not call.build_socket:
        return Refusal("only the build socket (--build-listen) commits a container")
    container = call.query.get("container", "")
    repository = f"{call.query.get('repo', '')}:{call.query.get('tag', '')}"
    reason = not_an_environment(repository)
    if reason or not container:
        return Refusal(reason or "it names no container")

    def target(container_id: str) -> str:
        committed = {**call.query, "container": container_id}
        return f"{call.version}/commit?{urlencode(committed)}"

    return Route(target, container=container, build_only=True,
                 body=lambda raw, _: rules.commit(raw), content_type=JSON)  # fmt: skip


def without_builds(answer: bytes) -> bytes:
    """A container list (`GET /containers/json`'s answer) without the build containers."""
    listed: list[dict[str, Any]] = json.loads(answer)
    kept = [item for item in listed if not is_build(item.get("Labels") or {})]
    return json.dumps(kept).encode()


# -- the table --------------------------------------------------------------------------------

NAME = matching(r"/?[A-Za-z0-9][A-Za-z0-9_.-]*", "a container name")
NO_PARAMS: Mapping[str, Param] = {}
LIST = {"all": flag, "limit": integer, "size": flag, "filters": text, "trunc_cmd": ignored}
CREATE = {"name": NAME}
REMOVE = {"v": flag, "force": flag, "link": false_flag}
INSPECT = {"size": flag}
TAIL = matching(r"all|[0-9]{1,9}", "all or a number")
LOGS = {"stdout": flag, "stderr": flag, "timestamps": flag, "follow": flag, "details": flag,
        "tail": TAIL, "since": text, "until": text}  # fmt: skip
ARCHIVE = {"path": text}
PUT_ARCHIVE = {"path": text, "noOverwriteDirNonDir": flag, "copyUIDGID": flag}
WAIT = {"condition": matching(r"not-running|next-exit|removed", "a wait condition")}
RENAME = {"name": NAME}
KILL = {"signal": matching(r"[A-Za-z0-9+]{1,16}", "a signal")}
STOP = {"t": integer}
RESIZE = {"h": integer, "w": integer}
REMOVE_IMAGE = {"force": flag, "noprune": flag}
COMMIT = {"container": text, "repo": text, "tag": text, "pause": flag}

GET, HEAD, POST, PUT, DELETE = "GET", "HEAD", "POST", "PUT", "DELETE"
Handler = Callable[[Call], "Refusal | Route"]
ROUTES: tuple[tuple[tuple[str, ...], tuple[str, ...], Mapping[str, Param], Handler], ...] = (
    (("_ping",), (GET, HEAD), NO_PARAMS, _forward),
    (("version",), (GET,), NO_PARAMS, _forward),
    (("info",), (GET,), NO_PARAMS, _forward),
    (("images", "**"), (GET,), NO_PARAMS, _image),
    (("images", "**"), (DELETE,), REMOVE_IMAGE, _image),
    (("commit",), (POST,), COMMIT, _commit),
    (("containers", "json"), (GET,), LIST, _list),
    (("containers", "create"), (POST,), CREATE, _create),
    (("containers", "*"), (DELETE,), REMOVE, _on_container),
    (("containers", "*", "json"), (GET,), INSPECT, _on_container),
    (("containers", "*", "logs"), (GET,), LOGS, _on_container),
    (("containers", "*", "archive"), (GET, HEAD), ARCHIVE, _on_container),
    (("containers", "*", "archive"), (PUT,), PUT_ARCHIVE, _on_container),
    (("containers", "*", "exec"), (POST,), NO_PARAMS, _on_container),
    (("containers", "*", "start"), (POST,), NO_PARAMS, _on_container),
    (("containers", "*", "wait"), (POST,), WAIT, _on_container),
    (("containers", "*", "rename"), (POST,), RENAME, _on_container),
    (("containers", "*", "kill"), (POST,), KILL, _on_container),
    (("containers", "*", "stop"), (POST,), STOP, _on_container),
    (("exec", "*", "json"), (GET,), NO_PARAMS, _on_exec),
    (("exec", "*", "start"), (POST,), NO_PARAMS, _on_exec),
    (("exec", "*", "resize"), (POST,), RESIZE, _on_exec),
)
"""Every request the gate forwards, by path segments after the version, with the query
parameters each may carry; the rest is refused."""
