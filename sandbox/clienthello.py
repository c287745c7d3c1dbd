"""The server name a TLS client asks for, read from its first message (the ClientHello), so the
egress proxy can hold a tunnel to the host it was opened for.

    hello = parse(data)  # None while the ClientHello has not all arrived
    hello.server_name    # "pypi.org", or None when the client named no server

`data` is what the client sent first, as it came: TLS records (RFC 8446 §5.1), perhaps split
across reads, the ClientHello perhaps split across records. The parser is strict and bounded:
handshake records only, at most `MAX_RECORDS` of them, a ClientHello of at most
`MAX_HELLO_BYTES` that ends where its record ends, every length inside its parent, no extension
twice, exactly one `host_name` in the server_name extension (RFC 6066 §3), no encrypted
ClientHello (its outer name is not where the tunnel goes). Anything else raises
`ClientHelloError`, as soon as the bytes in hand show it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandbox.errors import ClientHelloError

HANDSHAKE_RECORD = 22
CLIENT_HELLO = 1
SERVER_NAME = 0
"""The server_name extension (RFC 6066 §3)."""
ENCRYPTED_CLIENT_HELLO = 0xFE0D
HOST_NAME = 0
RECORD_HEADER_BYTES = 5
HANDSHAKE_HEADER_BYTES = 4
MAX_RECORD_BYTES = 2**14
"""The largest plaintext record TLS allows (RFC 8446 §5.1)."""
MAX_HELLO_BYTES = 16384
"""The largest ClientHello body accepted (post-quantum key shares included, it is far less)."""
MAX_RECORDS = 4
"""Records a ClientHello may span: two hold the largest accepted, the rest is slack."""
MAX_NAME_BYTES = 254
"""A DNS name's 253 characters and a trailing dot."""
HOST_NAME_PATTERN = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


@dataclass(frozen=True)
class ClientHello:
    """What the proxy needs of a ClientHello."""

    server_name: str | None
    """The `host_name` asked for, lower-case and without a trailing dot; None if none was."""


def parse(data: bytes) -> ClientHello | None:
    """The ClientHello at the start of `data`; None while more bytes are needed.

    Raises `ClientHelloError` when `data` is not the start of a well-formed ClientHello."""
    message = _handshake_message(data)
    if message is None:
        return None
    return ClientHello(server_name=_server_name(message))


def _handshake_message(data: bytes) -> bytes | None:
    """The ClientHello's body, put together from the records it spans; None if incomplete."""
    fragments = b""
    offset = 0
    for _ in range(MAX_RECORDS):
        header = data[offset : offset + RECORD_HEADER_BYTES]
        if header[:1] and header[0] != HANDSHAKE_RECORD:
            raise ClientHelloError(f"not a TLS handshake record (type {header[0]})")
        if header[1:2] and header[1] != 3:
            raise ClientHelloError(f"not a TLS record (version {header[1]}.x)")
        if len(header) < RECORD_HEADER_BYTES:
            return None
        length = int.from_bytes(header[3:5], "big")
        if not 0 < length <= MAX_RECORD_BYTES:
            raise ClientHelloError(f"a TLS record of {length} bytes")
        offset += RECORD_HEADER_BYTES
        fragment = data[offset : offset + length]
        size = _message_size(fragments + fragment)
        if size is not None and len(fragments) + length > size:
            raise ClientHelloError("bytes after the ClientHello in its record")
        if len(fragment) < length:
            return None
        fragments += fragment
        offset += length
        if size is not None and len(fragments) == size:
            return fragments[HANDSHAKE_HEADER_BYTES:]
    raise ClientHelloError(f"a ClientHello spread over more than {MAX_RECORDS} records")


def _message_size(fragments: bytes) -> int | None:
    """The whole handshake message's length, header included, once its header is in."""
    if fragments[:1] and fragments[0] != CLIENT_HELLO:
        raise ClientHelloError(f"the first handshake message is not a ClientHello ({fragments[0]})")
    if len(fragments) < HANDSHAKE_HEADER_BYTES:
        return None
    size = int.from_bytes(fragments[1:4], "big")
    if size > MAX_HELLO_BYTES:
        raise ClientHelloError(f"a ClientHello of {size} bytes, over {MAX_HELLO_BYTES}")
    return HANDSHAKE_HEADER_BYTES + size


class _Reader:
    """Reads a TLS structure, each length checked against what holds it."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.what, self.at = data, what, 0

    @property
    def done(self) -> bool:
        return self.at == len(self.data)

    def take(self, count: int, what: str) -> bytes:
        if self.at + count > len(self.data):
            raise ClientHelloError(f"{what} runs past the end of {self.what}")
        self.at += count
        return self.data[self.at - count : self.at]

    def number(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "big")

    def vector(self, length_bytes: int, what: str) -> _Reader:
        return _Reader(self.take(self.number(length_bytes, what), what), what)


def _server_name(message: bytes) -> str | None:
    extensions = _extensions(message)
    seen: set[int] = set()
    name = None
    while extensions is not None and not extensions.done:
        kind = extensions.number(2, "an extension's type")
        body = extensions.vector(2, f"extension {kind}")
        if kind in seen:
            raise ClientHelloError(f"extension {kind} twice")
        seen.add(kind)
        if kind == ENCRYPTED_CLIENT_HELLO:
            raise ClientHelloError("an encrypted ClientHello, whose server name is hidden")
        if kind == SERVER_NAME:
            name = _host_name(body)
    return name


def _extensions(message: bytes) -> _Reader | None:
    """The ClientHello's extensions, after the fields before them; None if it has none."""
    hello = _Reader(message, "the ClientHello")
    if hello.number(1, "its version") != 3:
        raise ClientHelloError("a ClientHello of a version other than TLS")
    hello.take(1 + 32, "its random")
    if len(hello.vector(1, "its session id").data) > 32:
        raise ClientHelloError("a session id over 32 bytes")
    suites = hello.vector(2, "its cipher suites").data
    if not suites or len(suites) % 2:
        raise ClientHelloError(f"cipher suites of {len(suites)} bytes")
    if not hello.vector(1, "its compression methods").data:
        raise ClientHelloError("no compression method")
    if hello.done:
        return None  # no extensions at all
    extensions = hello.vector(2, "its extensions")
    if not hello.done:
        raise ClientHelloError("bytes after the ClientHello's extensions")
    return extensions


def _host_name(extension: _Reader) -> str:
    names = extension.vector(2, "the server name list")
    if not extension.done:
        raise ClientHelloError("bytes after the server name list")
    found: list[bytes] = []
    while not names.done:
        if names.number(1, "a server name's type") != HOST_NAME:
            raise ClientHelloError("a server name that is not a host name")
        found.append(names.vector(2, "a host name").data)
    if len(found) != 1:
        raise ClientHelloError(f"{len(found)} host names, not one")
    (raw,) = found
    name = raw.decode("ascii", "replace").lower()
    if len(raw) > MAX_NAME_BYTES or not HOST_NAME_PATTERN.fullmatch(name):
        raise ClientHelloError(f"a host name that is not a DNS name ({raw[:80]!r})")
    return name.removesuffix(".")
