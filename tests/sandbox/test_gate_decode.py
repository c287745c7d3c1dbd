"""The gate's reading of request bodies, without dockerd: every key a Go decoder would read as
a setting's is read as that setting's, and whatever could be read two ways is refused.

The expected outcomes come from Go 1.19's encoding/json rules (case-insensitive field names,
U+017F and U+212A folded into s and k, the last of two keys winning, maps keeping their keys),
which the integration tests check against the real dockerd (test_gate_spelling.py)."""

from __future__ import annotations

import json

import pytest

from sandbox.gate.decode import GoStruct, Int64, decode, encode, parse
from sandbox.gate.errors import Refused
from sandbox.gate.schema import CreateBody, ExecBody, HostSettings


class InnerStruct(GoStruct):
    Flag: bool | None = None
    Size: Int64 | None = None
    Names: list[str] | None = None
    Map: dict[str, str] | None = None


class Outer(GoStruct):
    Inner: InnerStruct | None = None
    Kind: str | None = None


def refusal(raw: bytes | str, shape: type[GoStruct] = Outer) -> str:
    with pytest.raises(Refused) as refused:
        decode(shape, raw.encode() if isinstance(raw, str) else raw)
    return refused.value.reason


# -- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["Kind", "kind", "KIND", "kInD"], ids=["exact", "lower", "upper", "mixed"]
)
def test_a_key_names_its_field_in_any_ascii_case(key: str) -> None:
    assert decode(Outer, json.dumps({key: "x"}).encode()) == Outer(Kind="x")


def test_what_is_forwarded_is_spelled_as_docker_spells_it() -> None:
    read = decode(Outer, b'{"inner": {"FLAG": true, "names": ["a"]}, "kind": "k"}')
    assert json.loads(encode(read)) == {"Inner": {"Flag": True, "Names": ["a"]}, "Kind": "k"}


@pytest.mark.parametrize(
    "key",
    ["Kind\u017f", "\u017fize", "Fla\u0261", "\u212aind", "Kınd", "Ｋind"],
    ids=["long-s-tail", "long-s-head", "script-g", "kelvin", "dotless-i", "fullwidth"],
)
def test_a_key_that_is_not_ascii_is_refused_wherever_it_folds(key: str) -> None:
    """Go 1.19 reads ſ as s and K as k; a later Go folds more. None is guessed: all refused."""
    assert "is not ASCII" in refusal(json.dumps({"Inner": {key: True}}))
    assert "is not ASCII" in refusal(json.dumps({key: "x"}))


@pytest.mark.parametrize(
    "body",
    [
        '{"Kind": "a", "kind": "b"}',
        '{"kind": "a", "Kind": "b"}',
        '{"Inner": {"Flag": false, "flag": true}}',
        '{"Inner": {}, "INNER": {"Flag": true}}',
        '{"Inner": {"Size": 1, "sIzE": 2}}',
    ],
)
def test_two_keys_naming_one_field_are_refused(body: str) -> None:
    assert "name one setting" in refusal(body)


@pytest.mark.parametrize(
    "body",
    [
        '{"Kind": "a", "Kind": "b"}',
        '{"Inner": {"Flag": true, "Flag": false}}',
        '{"Inner": {"Map": {"a": "1", "a": "2"}}}',
    ],
)
def test_a_key_written_twice_is_refused_in_structs_and_maps(body: str) -> None:
    assert "appears twice" in refusal(body)


def test_map_keys_are_kept_exactly_and_may_differ_only_in_case() -> None:
    read = decode(Outer, b'{"Inner": {"Map": {"a": "1", "A": "2", "\\u017f": "3"}}}')
    assert read.Inner is not None and read.Inner.Map == {"a": "1", "A": "2", "ſ": "3"}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ('{"Other": 1}', "the body"),
        ('{"Inner": {"Other": 1}}', "Inner"),
        ('{"Inner": {"Flag": true, "Flagg": true}}', "Inner"),
        ('{"kind\\u0000": "x"}', "the body"),
    ],
)
def test_a_key_outside_the_allowlist_is_refused_at_any_depth(body: str, where: str) -> None:
    reason = refusal(body)
    assert reason.startswith(f"{where}: ") and "is not one the gate forwards here" in reason


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('{"Privileged": true}', "Privileged"),
        ('{"Image": "x", "capadd": ["SYS_ADMIN"]}', "capadd"),
        ('{"HostConfig": {}, "Binds": ["/:/h"]}', "Binds"),
        ('{"HostConfig": {"Privileged": false}}', "Privileged"),
        ('{"HostConfig": {"Mounts": [{"BindOptions": {}}]}}', "BindOptions"),
        ('{"HostConfig": {"Mounts": [{"TmpfsOptions": {}}]}}', "TmpfsOptions"),
        ('{"HostConfig": {"LogConfig": {"Type": "none", "Driver": "x"}}}', "Driver"),
        ('{"Volumes": {"/w": {"x": 1}}}', "x"),
        ('{"NetworkingConfig": {"EndpointsConfig": {"host": {}}}}', "EndpointsConfig"),
    ],
)
def test_docker_settings_the_gate_does_not_forward_are_refused_even_when_empty(
    body: str, key: str
) -> None:
    assert f"{key!r} is not one the gate forwards here" in refusal(body, CreateBody)


# -- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"Inner": {"Flag": 1}}', "Inner.Flag: Input should be a valid boolean"),
        ('{"Inner": {"Flag": "true"}}', "Inner.Flag: Input should be a valid boolean"),
        ('{"Inner": {"Size": true}}', "Inner.Size: Input should be a valid integer"),
        ('{"Inner": {"Size": "5"}}', "Inner.Size: Input should be a valid integer"),
        ('{"Inner": {"Size": 9223372036854775808}}', "Inner.Size: Input should be less than"),
        ('{"Inner": {"Size": -9223372036854775809}}', "Inner.Size: Input should be greater"),
        ('{"Inner": {"Names": "a"}}', "Inner.Names: Input should be a valid list"),
        ('{"Inner": {"Names": ["a", 1]}}', "Inner.Names.1: Input should be a valid string"),
        ('{"Inner": {"Map": {"a": 1}}}', "Inner.Map.a: Input should be a valid string"),
        ('{"Inner": []}', "Inner: Input should be a valid dictionary"),
        ('{"Kind": null, "Inner": "x"}', "Inner: Input should be a valid dictionary"),
    ],
)
def test_values_are_typed_strictly(body: str, expected: str) -> None:
    assert expected in refusal(body)


def test_the_int64_range_is_accepted_to_its_ends() -> None:
    for size in (2**63 - 1, -(2**63), 0):
        read = decode(Outer, json.dumps({"Inner": {"Size": size}}).encode())
        assert read.Inner is not None and read.Inner.Size == size


@pytest.mark.parametrize("number", ["1.0", "1e3", "1E400", "-0.0"])
def test_a_number_that_is_not_an_integer_is_refused(number: str) -> None:
    assert "fraction or an exponent" in refusal(f'{{"Inner": {{"Size": {number}}}}}')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_numbers_json_does_not_have_are_refused(constant: str) -> None:
    assert "which is not JSON" in refusal(f'{{"Inner": {{"Size": {constant}}}}}')


def test_null_leaves_a_setting_unset_and_is_not_forwarded() -> None:
    read = decode(Outer, b'{"Inner": {"Flag": null, "Names": null}, "Kind": null}')
    assert json.loads(encode(read)) == {"Inner": {}}


# -- the body as a whole ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", "not one JSON value"),
        (b"[]", "not a JSON object"),
        (b'"x"', "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"Kind": "a"} {"Kind": "b"}', "not one JSON value"),
        (b'{"Kind": "a"}x', "not one JSON value"),
        (b'{"Kind": "\xff"}', "not UTF-8 (byte 10)"),
        (b'{"Kind": "\xed\xa0\x80"}', "not UTF-8"),
        ('{"Kind": "a"}'.encode("utf-16"), "not UTF-8"),
        (b'\xef\xbb\xbf{"Kind": "a"}', "not one JSON value"),
        (b'{"Kind": "a",}', "not one JSON value"),
    ],
    ids=[
        "empty", "array", "string", "null", "two-values", "trailing-garbage", "invalid-utf8",
        "encoded-surrogate", "utf16", "bom", "trailing-comma",
    ],
)  # fmt: skip
def test_a_body_that_is_not_one_json_object_in_utf8_is_refused(raw: bytes, expected: str) -> None:
    assert expected in refusal(raw)


def test_an_unpaired_surrogate_escape_is_refused_when_forwarded() -> None:
    """Go would read `\\ud800` as U+FFFD: the gate would forward something else than it read."""
    read = decode(Outer, b'{"Kind": "\\ud800"}')
    with pytest.raises(Refused, match="unpaired surrogate"):
        encode(read)


def test_parse_keeps_the_caller_s_values_for_the_models() -> None:
    assert parse(b'{"a": {"b": [1, "x", true, null]}}') == {"a": {"b": [1, "x", True, None]}}


# -- the models -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [CreateBody, HostSettings, ExecBody, Outer, InnerStruct])
def test_no_two_fields_of_a_model_differ_only_in_case(shape: type[GoStruct]) -> None:
    names = list(shape.model_fields)
    assert len({name.lower() for name in names}) == len(names)


def test_an_exec_body_docker_py_sends_is_read_whole() -> None:
    sent = {"Container": "c1", "User": "1000:1000", "Privileged": False, "Tty": False,
            "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "Cmd": ["true"],
            "Env": ["A=b"], "WorkingDir": "/w"}  # fmt: skip
    read = decode(ExecBody, json.dumps(sent).encode())
    assert read.model_dump(exclude_none=True) == sent


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"Inner": {"Size": 1' + b"0" * 5000 + b"}}", "far out of any range"),
        (b'{"Kind": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
    ],
    ids=["huge-integer", "deep-nesting"],
)
def test_a_body_python_cannot_read_whole_is_refused_not_crashed_on(
    raw: bytes, expected: str
) -> None:
    assert expected in refusal(raw)
