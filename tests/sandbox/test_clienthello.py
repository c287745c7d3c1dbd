"""The ClientHello parser, on real ClientHellos (made by Python's ssl module, as a client's first
flight) and on ones built field by field here to be wrong in one way each."""

from __future__ import annotations

import pickle
import ssl

import pytest

from sandbox.clienthello import ClientHello, parse
from sandbox.errors import ClientHelloError


def real_hello(server_hostname: str | None) -> bytes:
    """The first bytes an OpenSSL client sends for `server_hostname`."""
    context = ssl.create_default_context()
    context.check_hostname = server_hostname is not None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def record(body: bytes, kind: int = 22, version: bytes = b"\x03\x01") -> bytes:
    return bytes([kind]) + version + len(body).to_bytes(2, "big") + body


def handshake(body: bytes, kind: int = 1) -> bytes:
    return bytes([kind]) + len(body).to_bytes(3, "big") + body


def extension(kind: int, body: bytes) -> bytes:
    return kind.to_bytes(2, "big") + len(body).to_bytes(2, "big") + body


def server_name(*names: bytes, name_type: int = 0) -> bytes:
    entries = b"".join(bytes([name_type]) + len(n).to_bytes(2, "big") + n for n in names)
    return extension(0, len(entries).to_bytes(2, "big") + entries)


def hello_body(
    extensions: bytes | None,
    session_id: bytes = b"",
    suites: bytes = b"\x13\x01",
    compression: bytes = b"\x00",
) -> bytes:
    body = b"\x03\x03" + bytes(32) + bytes([len(session_id)]) + session_id
    body += len(suites).to_bytes(2, "big") + suites + bytes([len(compression)]) + compression
    if extensions is not None:
        body += len(extensions).to_bytes(2, "big") + extensions
    return body


def built(extensions: bytes | None) -> bytes:
    return record(handshake(hello_body(extensions)))


def in_records(data: bytes, sizes: list[int]) -> bytes:
    """The handshake message of single-record `data` spread over records of `sizes` bytes, the
    last taking the rest."""
    message, records = data[5:], b""
    for size in sizes:
        records += record(message[:size])
        message = message[size:]
    return records + record(message)


@pytest.mark.parametrize(
    ("server_hostname", "expected"),
    [("pypi.org", "pypi.org"), ("files.pythonhosted.org", "files.pythonhosted.org"),
     ("Deb.Debian.Org", "deb.debian.org"), ("registry.npmjs.org.", "registry.npmjs.org")],
)  # fmt: skip
def test_a_real_client_hello_gives_its_server_name(server_hostname: str, expected: str) -> None:
    assert parse(real_hello(server_hostname)) == ClientHello(server_name=expected)


@pytest.mark.parametrize("server_hostname", [None, "203.0.113.80"])
def test_a_real_client_hello_without_a_server_name_gives_none(server_hostname: str | None) -> None:
    assert parse(real_hello(server_hostname)) == ClientHello(server_name=None)


def test_every_beginning_of_a_client_hello_asks_for_more() -> None:
    data = real_hello("pypi.org")

    assert [cut for cut in range(len(data)) if parse(data[:cut]) is not None] == []
    assert parse(data) == ClientHello(server_name="pypi.org")


@pytest.mark.parametrize("sizes", [[1], [3, 1], [4], [100, 100, 100]])
def test_a_client_hello_spread_over_records_is_put_together(sizes: list[int]) -> None:
    data = in_records(real_hello("pypi.org"), sizes)

    assert [cut for cut in range(len(data)) if parse(data[:cut]) is not None] == []
    assert parse(data) == ClientHello(server_name="pypi.org")


def test_what_follows_the_client_hello_in_later_records_is_left_alone() -> None:
    change_cipher_spec = record(b"\x01", kind=20, version=b"\x03\x03")

    assert parse(real_hello("pypi.org") + change_cipher_spec + b"\x17\x03") == ClientHello(
        server_name="pypi.org"
    )


def test_a_built_client_hello_parses_as_the_control_for_the_faults_below() -> None:
    assert parse(built(server_name(b"pypi.org") + extension(43, b"\x02\x03\x04"))) == ClientHello(
        server_name="pypi.org"
    )
    assert parse(built(None)) == ClientHello(server_name=None)


SNI = server_name(b"pypi.org")


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        (b"GET / HTTP/1.1\r\n", "not a TLS handshake record"),
        (b"tls!", "not a TLS handshake record"),
        (b"\x80\x2e\x01\x00\x02", "not a TLS handshake record"),  # an SSLv2 ClientHello
        (b"\x16\x02", "not a TLS record"),
        (record(b""), "a TLS record of 0 bytes"),
        (b"\x16\x03\x01\x40\x01" + bytes(100), "a TLS record of 16385 bytes"),
        (record(handshake(b"", kind=2)), "not a ClientHello"),
        (b"\x16\x03\x01\x00\x04\x01\x01\x00\x00", "a ClientHello of 65536 bytes, over 16384"),
        (b"\x16\x03\x01\xff\xff" + bytes(70000), "a TLS record of 65535 bytes"),
        (record(handshake(hello_body(SNI)) + b"\x01"), "bytes after the ClientHello in its record"),
        (in_records(built(SNI), [1, 1, 1, 1]), "more than 4 records"),
        (record(handshake(b"\x02\x00" + bytes(40))), "a version other than TLS"),
        (record(handshake(hello_body(SNI, session_id=bytes(33)))), "a session id over 32"),
        (record(handshake(hello_body(SNI, suites=b"\x13"))), "cipher suites of 1 bytes"),
        (record(handshake(hello_body(SNI, compression=b""))), "no compression method"),
        (record(handshake(hello_body(SNI)[:-1])), "runs past the end"),
        (record(handshake(hello_body(SNI) + b"\x00")), "bytes after the ClientHello's extensions"),
        (built(SNI + server_name(b"evil.example")), "extension 0 twice"),
        (built(server_name(b"pypi.org", b"evil.example")), "2 host names, not one"),
        (built(server_name()), "0 host names, not one"),
        (built(server_name(b"pypi.org", name_type=1)), "not a host name"),
        (built(server_name(b"pypi.org\x00.evil.example")), "not a DNS name"),
        (built(server_name(b"pypi.org/evil")), "not a DNS name"),
        (built(server_name(b"a" * 255)), "not a DNS name"),
        (built(extension(0, b"\x00\x0b\x00\x00\x08pypi.org\x00")), "bytes after the server name"),
        (built(SNI + extension(0xFE0D, bytes(40))), "an encrypted ClientHello"),
    ],
)
def test_a_malformed_or_oversized_client_hello_is_refused_saying_what_is_wrong(
    data: bytes, fault: str
) -> None:
    with pytest.raises(ClientHelloError, match=fault):
        parse(data)


def test_a_refusal_comes_as_soon_as_the_bytes_in_hand_show_it() -> None:
    oversized = b"\x16\x03\x01\x00\x04\x01\x01\x00\x00"  # a record header and a handshake header

    with pytest.raises(ClientHelloError, match="over 16384"):
        parse(oversized)
    assert parse(oversized[:-1]) is None  # the control: one byte less, nothing to judge yet


def test_the_error_is_a_value_error_and_survives_pickling() -> None:
    error = ClientHelloError("extension 0 twice")
    copy = pickle.loads(pickle.dumps(error))

    assert isinstance(copy, ValueError)
    assert (type(copy), str(copy), copy.args) == (ClientHelloError, "extension 0 twice", error.args)
