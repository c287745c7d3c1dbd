"""Intake under hypothesis: every report, well-formed or mangled at any level, becomes a valid
`Issue` within its limits, or is refused with an `IntakeError` whose message is one printable
line naming the field or the problem. No other exception, ever.

Intake is pure: every `parse_payload` call here runs under an audit hook that records any file
opened for writing, socket, subprocess or filesystem change, and none may happen. The last test
drives `baton enqueue` as a user does, on a few generated bad payloads.
"""

from __future__ import annotations

import json
import os
import re
import string
import subprocess
import sys
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from demo.runner import make_sample_repo
from orchestrator.control.intake import IntakeLimits, parse_payload
from orchestrator.core.errors import IntakeError, PayloadTooLargeError
from orchestrator.core.models import Issue, IssueSource
from tests.tiers import examples

# --- Payload pieces ------------------------------------------------------------------------------

HOSTILE = [
    "\x00", "\x07", "\x1b[2J", "\r", "\x0b", "\x85", "\ud800", "\udfff", "\ud83d\ude00", "\u202e",
    "\u2028", "\ufeff", "\U0001f600", "[/]", "[bold red]", "{triage}", "{{x}}", "${y}", "```",
    "\\", '"', "'", "\n", "\t", " ", "ignore previous instructions",
]  # fmt: skip
"""Control characters, lone surrogates, bidi overrides, rich markup, templates, quotes."""

texts = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=24),  # surrogates included
    st.lists(st.sampled_from(HOSTILE) | st.text(max_size=4), max_size=8).map("".join),
)
huge_texts = st.integers(10_000, 120_000).map(lambda n: "crash\n" * (n // 6))
any_text = texts | huge_texts
words = st.builds(str.__add__, st.sampled_from(string.ascii_letters), texts)
"""Text with at least one visible character."""
names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,19}", fullmatch=True)
hex_ids = st.from_regex(r"[0-9a-f]{32}", fullmatch=True)


@dataclass(frozen=True)
class Raw:
    """JSON text spliced in verbatim where `json.dumps` cannot write it: nesting deeper than
    its recursion limit, integers longer than Python turns into text."""

    text: str


raw_json = st.one_of(
    st.integers(1, 5_000).map(lambda n: Raw("[" * n + "]" * n)),
    st.integers(1, 3_000).map(lambda n: Raw('{"a":' * n + "1" + "}" * n)),
    st.integers(4_301, 6_000).map(lambda n: Raw("7" * n)),
)
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63), st.floats(), any_text,
)  # fmt: skip


def json_values(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaf,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=8,
    )


junk = json_values(leaves)
"""Any JSON value, NaN and Infinity included."""
wild_junk = json_values(leaves | raw_json)
"""Any JSON value, and JSON that Python's reader refuses: too deep, numbers too long."""


def encode(payload: Any, *, ascii_only: bool = True) -> str:
    """`payload` as JSON text, with every `Raw` spliced in."""
    raws: list[str] = []

    def placeholder(value: Any) -> str:
        if not isinstance(value, Raw):
            raise TypeError(type(value).__name__)
        raws.append(value.text)
        return f"\x00raw{len(raws) - 1}\x00"

    text = json.dumps(payload, default=placeholder, ensure_ascii=ascii_only)
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{index}\x00"), raw, 1)
    return text


# --- Well-formed reports of every accepted shape -------------------------------------------------

sdk_frames = st.fixed_dictionaries(
    {"filename": words},
    optional={
        "abs_path": any_text, "lineno": st.integers(-3, 10**6) | st.none(), "function": texts,
        "module": texts, "context_line": any_text, "in_app": st.booleans(),
    },
)  # fmt: skip
api_frames = st.fixed_dictionaries(
    {"filename": words, "lineNo": st.integers(1, 500)},
    optional={
        "absPath": texts, "function": texts, "inApp": st.booleans(),
        "context": st.lists(st.tuples(st.integers(1, 500), any_text).map(list), max_size=4),
    },
)  # fmt: skip


def exceptions(frames: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": words},
        optional={
            "value": any_text,
            "module": texts | st.none(),
            "stacktrace": st.fixed_dictionaries({"frames": st.lists(frames, max_size=12)}),
        },
    )


tag_values = st.one_of(texts, st.integers(), st.floats(), st.booleans(), st.none())
sdk_events = st.fixed_dictionaries(
    {
        "event_id": hex_ids,
        "exception": st.fixed_dictionaries(
            {"values": st.lists(exceptions(sdk_frames), min_size=1, max_size=3)}
        ),
    },
    optional={
        "level": texts, "platform": texts, "transaction": texts, "culprit": texts,
        "title": texts, "message": any_text,
        "logentry": st.fixed_dictionaries({"formatted": any_text}),
        "tags": st.dictionaries(texts, tag_values, max_size=50)
        | st.lists(st.tuples(texts, tag_values).map(list), max_size=50),
    },
)  # fmt: skip


@st.composite
def api_events(draw: st.DrawFn) -> dict[str, Any]:
    """The web API's shape: typed entries in any order, camelCase frames, `{key, value}` tags."""
    chain = draw(st.lists(exceptions(api_frames), min_size=1, max_size=3))
    entries = [{"type": "exception", "data": {"values": chain}}]
    if draw(st.booleans()):
        entries.append({"type": "message", "data": {"formatted": draw(any_text)}})
    if draw(st.booleans()):
        entries.append({"type": "request", "data": draw(junk)})
    event = {"eventID": draw(hex_ids), "entries": draw(st.permutations(entries))}
    tags = st.fixed_dictionaries({"key": texts, "value": tag_values})
    optional = {"title": texts, "culprit": texts, "platform": texts, "tags": st.lists(tags)}
    return {**event, **draw(st.fixed_dictionaries({}, optional=optional))}


sentry_issues = st.fixed_dictionaries(
    {"shortId": names, "latestEvent": sdk_events | api_events()},
    optional={
        "id": st.from_regex(r"[0-9]{1,12}", fullmatch=True), "title": texts, "culprit": texts,
        "level": texts, "platform": texts,
        "permalink": names.map(lambda n: f"https://sentry.io/organizations/o/issues/{n}/")
        | texts,
        "metadata": st.fixed_dictionaries({}, optional={"type": texts, "value": any_text}),
    },
)  # fmt: skip
labels = st.lists(texts | st.fixed_dictionaries({"name": texts}), max_size=50)
github_issues = st.builds(
    lambda owner, repo, number, fields: {
        "number": number,
        "html_url": f"https://github.com/{owner}/{repo}/issues/{number}",
        "repository_url": f"https://api.github.com/repos/{owner}/{repo}",
        **fields,
    },
    names, names, st.integers(1, 10**9),
    st.fixed_dictionaries(
        {"title": words},
        optional={
            "body": any_text | st.none(), "state": texts, "labels": labels,
            "user": st.fixed_dictionaries({"login": texts}),
        },
    ),
)  # fmt: skip
github_webhooks = st.builds(
    lambda action, issue, owner, repo: {
        "action": action, "issue": issue, "repository": {"full_name": f"{owner}/{repo}"},
    },
    st.sampled_from(["opened", "edited", "labeled"]), github_issues, names, names,
)  # fmt: skip
plain_texts = st.builds(
    lambda lead, first, rest: lead + first + rest,
    st.sampled_from(["", "\n\n", "  \t", "\ufeff"]),
    words,
    any_text,
)

SHAPES: dict[str, tuple[st.SearchStrategy[Any], IssueSource]] = {
    "sentry-sdk-event": (sdk_events, IssueSource.SENTRY_EVENT),
    "sentry-api-event": (api_events(), IssueSource.SENTRY_EVENT),
    "sentry-issue": (sentry_issues, IssueSource.SENTRY_ISSUE),
    "github-rest-issue": (github_issues, IssueSource.GITHUB),
    "github-webhook": (github_webhooks, IssueSource.GITHUB),
}
small_limits = st.builds(
    IntakeLimits,
    max_frames=st.integers(1, 12), max_title_chars=st.integers(1, 60),
    max_message_chars=st.integers(1, 300), max_body_chars=st.integers(1, 2_000),
    max_context_line_chars=st.integers(1, 60), max_tags=st.integers(0, 12),
    max_tag_chars=st.integers(1, 40), max_links=st.integers(0, 3),
    max_link_chars=st.integers(1, 120),
)  # fmt: skip
"""Small caps, so that every one of them is hit; the payload cap stays at its default."""


# --- Mangled reports -----------------------------------------------------------------------------


RETYPED = {
    "string": [7, 2.5, True, ["text"], {"text": "x"}],
    "integer": ["7", 2.5, True, [7], {"n": 7}],
    "float": ["7.5", True, [7.5]],
    "bool": ["true", 1, [True]],
    "list": ["x", 7, {"values": []}],
    "object": ["x", 7, ["x"]],
}
"""Values of other JSON types, for a value of each type."""
PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,39}")


def json_type(value: Any) -> str:
    for kind, types in (("bool", bool), ("integer", int), ("float", float), ("string", str),
                        ("list", list)):  # fmt: skip
        if isinstance(value, types):
            return kind
    return "object"


def places(
    value: Any, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[Any, Any, tuple[Any, ...]]]:
    """Every (container, key, path of the value) in a JSON value, outermost first."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in list(items):
        yield value, key, (*path, key)
        if isinstance(child, dict | list):
            yield from places(child, (*path, key))


def spelled(path: tuple[str | int, ...]) -> str:
    """The path as an error message names it, up to its first key that is not a plain name."""
    spelling = ""
    for key in path:
        if isinstance(key, int):
            spelling += f"[{key}]"
        elif PLAIN_NAME.fullmatch(key):
            spelling += f".{key}" if spelling else key
        else:
            break
    return spelling


@st.composite
def mutated(draw: st.DrawFn, payload: Any) -> Any:
    """`payload` with one field dropped, or given a value of the wrong type, or wrapped."""
    found = list(places(payload)) if isinstance(payload, dict | list) else []
    if not found or draw(st.integers(0, 9)) == 0:
        return draw(wild_junk)
    container, key, _ = draw(st.sampled_from(found))
    value = container[key]
    change = draw(st.sampled_from(["drop", "junk", "string", "number", "null", "list", "nest"]))
    if change == "drop":
        del container[key]
        return payload
    container[key] = {
        "junk": lambda: draw(wild_junk),
        "string": lambda: json.dumps(value, default=str)[:50],
        "number": lambda: draw(st.integers() | st.floats()),
        "null": lambda: None,
        "list": lambda: [value],
        "nest": lambda: {"values": value, "data": [value]},
    }[change]()
    return payload


@st.composite
def corrupted(draw: st.DrawFn, text: str) -> bytes | str:
    """The payload's bytes as sent: intact, cut short, spliced with binary junk, re-encoded,
    or left as a `str` that may carry lone surrogates."""
    data = text.encode("utf-8", "surrogatepass")
    at = draw(st.integers(0, len(data)))
    changes = ["intact"] * 4 + ["str"] * 4 + ["cut", "splice", "bom", "utf-16", "binary"]
    change = draw(st.sampled_from(changes))
    sent: dict[str, Callable[[], bytes | str]] = {
        "intact": lambda: data,
        "str": lambda: text,
        "cut": lambda: data[:at],
        "splice": lambda: data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:],
        "bom": lambda: b"\xef\xbb\xbf" + data,
        "utf-16": lambda: text.encode("utf-16", "surrogatepass"),
        "binary": lambda: draw(st.binary(max_size=64)),
    }
    return sent[change]()


@st.composite
def mangled_payloads(draw: st.DrawFn) -> bytes | str:
    """Any accepted shape (or plain text), mutated at one to three places, then corrupted."""
    shape = draw(st.sampled_from([*SHAPES, "text"]))
    if shape == "text":
        return draw(corrupted(draw(plain_texts | texts)))
    payload = draw(SHAPES[shape][0])
    for _ in range(draw(st.integers(1, 3))):
        payload = draw(mutated(payload))
    return draw(corrupted(encode(payload, ascii_only=draw(st.booleans()))))


@st.composite
def retyped(draw: st.DrawFn) -> tuple[Any, str]:
    """A well-formed report with one value replaced by a value of another JSON type, and the
    path of that value."""
    payload = draw(SHAPES[draw(st.sampled_from(list(SHAPES)))][0])
    found = [place for place in places(payload) if place[0][place[1]] is not None]
    container, key, path = draw(st.sampled_from(found))
    container[key] = draw(st.sampled_from(RETYPED[json_type(container[key])]))
    return payload, spelled(path)


any_limits = small_limits.flatmap(
    lambda limits: st.integers(1, 3_000_000).map(
        lambda size: limits.model_copy(update={"max_payload_bytes": size})
    )
)


# --- What every outcome must satisfy -------------------------------------------------------------

PAYLOAD_PROBLEMS = re.compile(
    "malformed JSON|not valid UTF-8|nested too deeply|number too long|expected a JSON object"
    "|unrecognised JSON object|the report is empty|over the intake limit"
)
"""What a refusal that names no field must name instead: the problem with the whole payload."""
FIELD = re.compile(r"(?:[A-Za-z_][\w-]*|\[.+?\])(?:\.[A-Za-z_][\w-]*|\[\d+\]|\[.+?\])*")
"""A dotted path: `exception.values[0].stacktrace.frames[3].lineno`, `tags['build id']`."""


def size_of(data: bytes | str) -> int:
    return len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))


def strings_in(value: Any, where: str = "issue") -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from strings_in(key, f"{where} key")
            yield from strings_in(child, f"{where}.{key}")
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from strings_in(child, f"{where}[{index}]")


def assert_capped(text: str | None, cap: int, where: str) -> None:
    """At most `cap` characters, or the first `cap` and a marker saying how many were cut."""
    if text is not None and len(text) > cap:
        assert re.fullmatch(rf"(?s).{{{cap}}}…\[cut [1-9][0-9]* chars\]", text), (where, cap)


def assert_valid(issue: Issue, limits: IntakeLimits) -> None:
    assert Issue.model_validate(issue.model_dump()) == issue
    assert Issue.model_validate_json(issue.model_dump_json()) == issue
    assert issue.title.strip()
    for where, text in strings_in(issue.model_dump(mode="json")):
        bad = [c for c in text if unicodedata.category(c) in ("Cc", "Cs") and c not in "\n\t"]
        assert not bad, (where, bad[:5])
    issue.digest().encode("utf-8")
    for field in ("title", "error_type", "culprit"):
        assert_capped(getattr(issue, field), limits.max_title_chars, field)
    assert_capped(issue.error_message, limits.max_message_chars, "error_message")
    assert_capped(issue.body, limits.max_body_chars, "body")
    for field in ("source_id", "level", "platform"):
        assert_capped(getattr(issue, field), limits.max_tag_chars, field)
    assert len(issue.frames) <= limits.max_frames
    for frame in issue.frames:
        assert frame.line is None or frame.line > 0
        for part in (frame.file, frame.function, frame.context_line):
            assert_capped(part, limits.max_context_line_chars, "frame")
    assert len(issue.tags) <= limits.max_tags
    for key, value in issue.tags.items():
        assert key.strip()
        assert_capped(key, limits.max_tag_chars, "tag key")
        assert_capped(value, limits.max_tag_chars, "tag value")
    assert len(issue.links) <= limits.max_links
    assert len(set(issue.links)) == len(issue.links)
    assert all(len(link) <= limits.max_link_chars for link in issue.links)
    assert all(re.match(r"https?://", link, re.IGNORECASE) for link in issue.links)


def assert_names_the_problem(exc: IntakeError) -> None:
    """A one-line, printable message that names a field (a dotted path) or the problem."""
    message = str(exc)
    assert exc.message.strip()
    assert message.isprintable(), repr(message[:300])
    if exc.field is not None:
        assert FIELD.fullmatch(exc.field), exc.field
    else:
        assert PAYLOAD_PROBLEMS.search(exc.message), exc.message


# --- Nothing is written anywhere -----------------------------------------------------------------

_EFFECTS = ("socket.", "subprocess.", "shutil.", "os.system", "os.exec", "os.posix_spawn",
            "os.spawn", "os.fork", "os.remove", "os.rename", "os.mkdir", "os.rmdir",
            "os.truncate", "os.chmod", "os.symlink", "os.link", "os.kill")  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_seen: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _seen is None:
        return
    if event == "open" and len(args) == 3:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and set(mode) & set("wax+")) or (flags or 0) & _WRITE_FLAGS:
            _seen.append(f"open {args[0]!r} {mode or flags}")
    elif event.startswith(_EFFECTS):
        _seen.append(event)


sys.addaudithook(_audit)


def parse_watched(
    data: bytes | str, source: IssueSource | None = None, *, limits: IntakeLimits
) -> Issue:
    """`parse_payload`, asserting that it wrote no file, opened no socket, started nothing."""
    global _seen
    _seen = []
    try:
        return parse_payload(data, source, limits=limits)
    finally:
        seen, _seen = _seen, None
        assert seen == [], f"parse_payload had side effects: {seen}"


# --- Properties ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), limits=small_limits, ascii_only=st.booleans())
def test_a_well_formed_report_becomes_a_valid_issue_within_every_limit(
    shape: str, data: st.DataObject, limits: IntakeLimits, ascii_only: bool
) -> None:
    strategy, source = SHAPES[shape]
    payload = data.draw(strategy)

    detected = parse_watched(encode(payload).encode(), limits=limits)
    named = parse_watched(encode(payload, ascii_only=ascii_only), source, limits=limits)

    assert detected.source == named.source == source
    assert_valid(detected, limits)
    assert named == detected


@settings(max_examples=examples(80), deadline=None)
@given(text=plain_texts, limits=small_limits)
def test_plain_text_becomes_an_issue_titled_by_its_first_line(
    text: str, limits: IntakeLimits
) -> None:
    issue = parse_watched(text, IssueSource.TEXT, limits=limits)

    assert issue.source == IssueSource.TEXT
    assert_valid(issue, limits)
    assert "\n" not in issue.title


@settings(max_examples=examples(300), deadline=None)
@given(case=retyped())
def test_a_value_of_the_wrong_type_is_ignored_or_refused_naming_its_field(
    case: tuple[Any, str],
) -> None:
    payload, path = case
    try:
        issue = parse_watched(encode(payload), limits=IntakeLimits())
    except IntakeError as exc:
        assert_names_the_problem(exc)
        assert exc.field is not None
        assert exc.field.startswith(path) or path.startswith(exc.field), (exc.field, path)
    else:
        assert_valid(issue, IntakeLimits())


@settings(max_examples=examples(150), deadline=None)
@given(
    tags=st.dictionaries(texts, junk, min_size=1, max_size=4)
    | st.lists(st.lists(junk, min_size=2, max_size=2) | junk, min_size=1, max_size=4),
    in_issue=st.booleans(),
)
def test_tags_of_any_key_and_value_are_kept_clean_or_refused_naming_the_tag(
    tags: Any, in_issue: bool
) -> None:
    event = {"event_id": "e1", "exception": {"values": [{"type": "KeyError"}]}, "tags": tags}
    payload = {"shortId": "P-1", "latestEvent": event} if in_issue else event
    try:
        issue = parse_watched(encode(payload), limits=IntakeLimits())
    except IntakeError as exc:
        assert_names_the_problem(exc)
        assert exc.field is not None
        assert exc.field.startswith("latestEvent.tags" if in_issue else "tags"), exc.field
    else:
        assert_valid(issue, IntakeLimits())


@settings(max_examples=examples(500), deadline=None)
@given(
    data=mangled_payloads(),
    source=st.none() | st.sampled_from(IssueSource),
    limits=any_limits,
)
@example(data=b'{"[/]": 1, "tags": {}}', source=None, limits=IntakeLimits())
@example(
    data=json.dumps({"exception": [{"type": "E"}], "tags": {"\x1b[2J\n\ud800": []}}),
    source=None,
    limits=IntakeLimits(),
)
def test_any_payload_becomes_a_valid_issue_or_a_refusal_that_names_the_problem(
    data: bytes | str, source: IssueSource | None, limits: IntakeLimits
) -> None:
    if size_of(data) > limits.max_payload_bytes:
        with pytest.raises(PayloadTooLargeError) as refused:
            parse_watched(data, source, limits=limits)
        assert_names_the_problem(refused.value)
        return
    try:
        issue = parse_watched(data, source, limits=limits)
    except IntakeError as exc:
        assert_names_the_problem(exc)
    else:
        assert_valid(issue, limits)


# --- The command line ----------------------------------------------------------------------------


@pytest.fixture
def cli_db(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    url = redis_url.rsplit("/", 1)[0] + "/9"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.flushdb()
    client.close()


def refused(data: bytes | str) -> bool:
    try:
        parse_payload(data)
    except IntakeError:
        return True
    return False


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(payload=mangled_payloads().map(lambda d: d.encode("utf-8", "surrogatepass") if isinstance(
    d, str) else d).filter(refused))  # fmt: skip
@example(payload=b'{"[/]": "a key that is rich markup", "zz": 1}')
@example(payload=json.dumps({"event_id": "e", "exception": {"values": [{"type": "x" * 300}]},
                             "tags": {"k" * 500: {}}}).encode())  # fmt: skip
def test_baton_enqueue_refuses_a_bad_payload_in_one_line_and_writes_nothing(
    payload: bytes, cli_db: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, client = cli_db
    repo = tmp_path / "repo"
    if not repo.exists():
        make_sample_repo(repo)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.control.cli", "enqueue", "-", "--repo", str(repo)],
        env={**os.environ, "BATON_REDIS_URL": url},
        input=payload,
        capture_output=True,
        timeout=60,
    )
    stderr = done.stderr.decode()

    assert done.returncode == 2, stderr
    assert stderr.startswith("error: ") and not re.match(r"error: \w+Error: ", stderr), stderr
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
    assert done.stdout == b""
    assert client.dbsize() == 0
