"""Intake: every accepted shape becomes the expected `Issue`; everything else is refused with a
message that names the field."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from demo import SENTRY_EVENT
from orchestrator.control.intake import IntakeLimits, detect_source, parse_payload
from orchestrator.core.errors import IntakeError, PayloadTooLargeError
from orchestrator.core.models import Frame, Issue, IssueSource

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def parse(payload: dict[str, Any] | list[Any], **kwargs: Any) -> Issue:
    return parse_payload(json.dumps(payload).encode(), **kwargs)


def sdk_frame(file: str, line: int, function: str, *, in_app: bool = True) -> dict[str, Any]:
    return {"filename": file, "lineno": line, "function": function, "in_app": in_app}


def sdk_event(*frames: dict[str, Any], **fields: Any) -> dict[str, Any]:
    raised = {"type": "KeyError", "value": "'sku'", "stacktrace": {"frames": list(frames)}}
    return {"event_id": "e1", "exception": {"values": [raised]}, **fields}


def api_event(*frames: dict[str, Any]) -> dict[str, Any]:
    raised = {"type": "KeyError", "stacktrace": {"frames": list(frames)}}
    return {"eventID": "e1", "entries": [{"type": "exception", "data": {"values": [raised]}}]}


# --- Sentry events -----------------------------------------------------------------------------

SDK_EVENT = {
    "event_id": "9f1c2b7e0d6a4c3b8e5f1a2b3c4d5e6f",
    "level": "error",
    "platform": "python",
    "transaction": "/checkout",
    "logentry": {"message": "checkout failed for %s", "formatted": "checkout failed for cart 7"},
    "tags": [["environment", "prod"], ["browser", "Firefox"]],
    "exception": {
        "values": [
            {
                "type": "KeyError",
                "value": "'sku'",
                "module": None,
                "stacktrace": {"frames": [sdk_frame("shop/db.py", 3, "load")]},
            },
            {
                "type": "OutOfStock",
                "value": "no stock for sku-1",
                "module": "shop.errors",
                "stacktrace": {
                    "frames": [
                        {
                            "filename": "django/core/handlers.py",
                            "abs_path": "/venv/django/core/handlers.py",
                            "lineno": 181,
                            "function": "_get_response",
                            "context_line": "    response = callback(request)",
                            "in_app": False,
                        },
                        {
                            "filename": "shop/views.py",
                            "lineno": 42,
                            "function": "checkout",
                            "context_line": "    reserve(cart)",
                            "in_app": True,
                        },
                    ]
                },
            },
        ]
    },
}

API_EVENT = {
    "id": "9f1c2b7e0d6a4c3b8e5f1a2b3c4d5e6f",
    "eventID": "9f1c2b7e0d6a4c3b8e5f1a2b3c4d5e6f",
    "title": "OutOfStock: no stock for sku-1",
    "culprit": "shop.views in checkout",
    "platform": "python",
    "tags": [{"key": "level", "value": "error"}, {"key": "environment", "value": "prod"}],
    "entries": [
        {"type": "breadcrumbs", "data": {"values": []}},
        {
            "type": "exception",
            "data": {
                "values": [
                    {
                        "type": "OutOfStock",
                        "value": "no stock for sku-1",
                        "module": "shop.errors",
                        "stacktrace": {
                            "frames": [
                                {
                                    "filename": None,
                                    "absPath": "/app/shop/urls.py",
                                    "lineNo": 9,
                                    "function": "dispatch",
                                    "context": [],
                                    "inApp": True,
                                },
                                {
                                    "filename": "shop/views.py",
                                    "absPath": "/app/shop/views.py",
                                    "lineNo": 42,
                                    "function": "checkout",
                                    "context": [
                                        [41, "    cart = load(request)"],
                                        [42, "    reserve(cart)"],
                                        [43, "    return ok()"],
                                    ],
                                    "inApp": True,
                                },
                            ]
                        },
                    }
                ]
            },
        },
    ],
}


def test_a_sentry_sdk_event_becomes_an_issue_about_the_last_exception_of_its_chain() -> None:
    assert parse(SDK_EVENT) == Issue(
        source=IssueSource.SENTRY_EVENT,
        source_id="9f1c2b7e0d6a4c3b8e5f1a2b3c4d5e6f",
        title="OutOfStock: no stock for sku-1",
        error_type="shop.errors.OutOfStock",
        error_message="no stock for sku-1",
        frames=[
            Frame(
                file="django/core/handlers.py",
                line=181,
                function="_get_response",
                context_line="    response = callback(request)",
            ),
            Frame(
                file="shop/views.py",
                line=42,
                function="checkout",
                context_line="    reserve(cart)",
                in_app=True,
            ),
        ],
        culprit="/checkout",
        level="error",
        platform="python",
        tags={"environment": "prod", "browser": "Firefox"},
        body="checkout failed for cart 7\n\n"
        "Earlier exceptions in the chain, oldest first:\n  KeyError: 'sku'",
    )


def test_a_sentry_api_event_with_camel_case_entries_becomes_an_issue() -> None:
    assert parse(API_EVENT) == Issue(
        source=IssueSource.SENTRY_EVENT,
        source_id="9f1c2b7e0d6a4c3b8e5f1a2b3c4d5e6f",
        title="OutOfStock: no stock for sku-1",
        error_type="shop.errors.OutOfStock",
        error_message="no stock for sku-1",
        frames=[
            Frame(file="/app/shop/urls.py", line=9, function="dispatch", in_app=True),
            Frame(
                file="shop/views.py",
                line=42,
                function="checkout",
                context_line="    reserve(cart)",
                in_app=True,
            ),
        ],
        culprit="shop.views in checkout",
        platform="python",
        tags={"level": "error", "environment": "prod"},
    )


@pytest.mark.parametrize(
    "tags",
    [
        {"release": "1.2", "retries": 3},
        [["release", "1.2"], ["retries", 3]],
        [{"key": "release", "value": "1.2"}, {"key": "retries", "value": 3}],
    ],
    ids=["object", "pairs", "key-value-objects"],
)
def test_sentry_tags_are_read_from_an_object_from_pairs_or_from_key_value_objects(
    tags: Any,
) -> None:
    issue = parse(sdk_event(sdk_frame("a.py", 1, "f"), tags=tags))

    assert issue.tags == {"release": "1.2", "retries": "3"}


def test_an_sdk_event_without_culprit_gets_the_innermost_in_app_frame_as_culprit() -> None:
    frames = [
        {**sdk_frame("shop/views.py", 4, "checkout"), "module": "shop.views"},
        {**sdk_frame("json/decoder.py", 9, "decode", in_app=False), "module": "json.decoder"},
    ]

    assert parse(sdk_event(*frames)).culprit == "shop.views in checkout"


def test_a_frame_without_filename_uses_abs_path_then_module_and_one_without_any_is_dropped() -> (
    None
):
    frames = [
        {"abs_path": "/srv/app/main.py", "lineno": 1, "function": "main"},
        {"module": "app.worker", "lineno": 2, "function": "run"},
        {"lineno": 3, "function": "nowhere"},
        {"filename": "app/db.py", "abs_path": "/srv/app/db.py", "lineno": 4, "function": "get"},
    ]

    issue = parse(sdk_event(*frames))

    assert [(f.file, f.line) for f in issue.frames] == [
        ("/srv/app/main.py", 1),
        ("app.worker", 2),
        ("app/db.py", 4),
    ]


# --- Sentry issues -----------------------------------------------------------------------------


@pytest.mark.parametrize("event_key", ["latestEvent", "latest_event", "event"])
def test_a_sentry_issue_takes_its_title_and_link_from_the_issue_and_its_error_from_the_event(
    event_key: str,
) -> None:
    payload = {
        "id": "4512",
        "shortId": "SHOP-1A",
        "title": "OutOfStock: no stock",
        "culprit": "shop.views in checkout",
        "permalink": "https://acme.sentry.io/issues/4512/",
        "level": "error",
        "platform": "python",
        "metadata": {"type": "OutOfStock", "value": "no stock"},
        event_key: API_EVENT,
    }

    issue = parse(payload)

    assert issue.source == IssueSource.SENTRY_ISSUE
    assert issue.source_id == "SHOP-1A"
    assert issue.title == "OutOfStock: no stock"
    assert issue.links == ["https://acme.sentry.io/issues/4512/"]
    assert issue.error_type == "shop.errors.OutOfStock"
    assert issue.error_message == "no stock for sku-1"
    assert [f.line for f in issue.frames] == [9, 42]


def test_a_sentry_issue_without_short_id_is_known_by_its_id() -> None:
    payload = {"id": "4512", "title": "Boom", "latestEvent": sdk_event(sdk_frame("a.py", 1, "f"))}

    assert parse(payload).source_id == "4512"


# --- GitHub ------------------------------------------------------------------------------------

GITHUB_ISSUE = {
    "number": 17,
    "title": "Checkout crashes on an empty cart",
    "body": "\n\nSteps:\n  1. open /checkout\n\n",
    "html_url": "https://github.com/acme/shop/issues/17",
    "repository_url": "https://api.github.com/repos/acme/shop",
    "labels": [{"name": "bug", "color": "d73a4a"}, "p1"],
    "state": "open",
    "user": {"login": "octocat"},
}
EXPECTED_GITHUB_ISSUE = Issue(
    source=IssueSource.GITHUB,
    source_id="acme/shop#17",
    title="Checkout crashes on an empty cart",
    tags={"state": "open", "author": "octocat", "label:bug": "true", "label:p1": "true"},
    links=["https://github.com/acme/shop/issues/17"],
    body="Steps:\n  1. open /checkout",
)


def test_a_github_rest_issue_becomes_an_issue() -> None:
    assert parse(GITHUB_ISSUE) == EXPECTED_GITHUB_ISSUE


def test_a_github_issues_webhook_becomes_the_same_issue() -> None:
    webhook = {
        "action": "opened",
        "issue": {**GITHUB_ISSUE, "repository_url": None},
        "repository": {"full_name": "acme/shop", "private": False},
        "sender": {"login": "octocat"},
    }

    assert parse(webhook) == EXPECTED_GITHUB_ISSUE


@pytest.mark.parametrize(
    ("urls", "source_id"),
    [
        ({"repository_url": "https://ghe.acme.dev/api/v3/repos/team/app"}, "team/app#17"),
        ({"html_url": "https://github.com/acme/shop/issues/17"}, "acme/shop#17"),
    ],
)
def test_a_github_issue_is_known_by_the_repository_its_urls_name(
    urls: dict[str, str], source_id: str
) -> None:
    payload = {"number": 17, "title": "Crash", **urls}

    assert parse(payload, source=IssueSource.GITHUB).source_id == source_id


# --- Plain text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "title", "body"),
    [
        (
            "Checkout crashes\nZeroDivisionError in cart.py",
            "Checkout crashes",
            "ZeroDivisionError in cart.py",
        ),
        (
            "\n\n   Checkout crashes  \r\n\r\n  indented detail\r\n\n",
            "Checkout crashes",
            "  indented detail",
        ),
        ("Just a title", "Just a title", None),
    ],
    ids=["title-and-body", "blank-lines-and-crlf", "title-only"],
)
def test_text_becomes_an_issue_whose_title_is_the_first_non_blank_line(
    text: str, title: str, body: str | None
) -> None:
    assert parse_payload(text) == Issue(source=IssueSource.TEXT, title=title, body=body)


# --- Detection and forcing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "source"),
    [
        ({"exception": {"values": []}}, IssueSource.SENTRY_EVENT),
        ({"entries": [], "eventID": "e1"}, IssueSource.SENTRY_EVENT),
        ({"event_id": "e1", "message": "hi"}, IssueSource.SENTRY_EVENT),
        ({"shortId": "SHOP-1", "title": "x"}, IssueSource.SENTRY_ISSUE),
        ({"latestEvent": {}, "title": "x"}, IssueSource.SENTRY_ISSUE),
        ({"id": "1", "permalink": "https://acme.sentry.io/issues/1/"}, IssueSource.SENTRY_ISSUE),
        ({"action": "opened", "issue": {}}, IssueSource.GITHUB),
        ({"action": "opened", "pull_request": {}}, IssueSource.PULL_REQUEST),
        ({"number": 1, "base": "main", "head": "fix"}, IssueSource.PULL_REQUEST),
        ({"number": 1, "html_url": "https://github.com/a/b/issues/1"}, IssueSource.GITHUB),
        (
            {"number": 1, "repository_url": "https://ghe.acme.dev/api/v3/repos/a/b"},
            IssueSource.GITHUB,
        ),
    ],
)
def test_a_json_object_is_recognised_by_its_keys(
    payload: dict[str, Any], source: IssueSource
) -> None:
    assert detect_source(payload) == source


@pytest.mark.parametrize(
    ("data", "source"),
    [
        (json.dumps(SDK_EVENT), IssueSource.SENTRY_EVENT),
        ("\ufeff  \n" + json.dumps(GITHUB_ISSUE), IssueSource.GITHUB),
        (b"\xef\xbb\xbf" + json.dumps(GITHUB_ISSUE).encode(), IssueSource.GITHUB),
        ("Checkout crashes {sometimes}", IssueSource.TEXT),
        (b"Panier vide \xc3\xa9chou\xc3\xa9", IssueSource.TEXT),
    ],
    ids=["sentry-json", "bom-and-blank-before-json", "bom-bytes", "text-with-braces", "utf8-text"],
)
def test_parse_payload_detects_the_source_when_none_is_named(
    data: str | bytes, source: IssueSource
) -> None:
    assert parse_payload(data).source == source


def test_a_named_source_overrides_detection() -> None:
    looks_like_github = {
        **sdk_event(sdk_frame("a.py", 1, "f")),
        "number": 3,
        "title": "Crash",
        "html_url": "https://github.com/a/b/issues/3",
    }

    assert parse(looks_like_github).source == IssueSource.GITHUB
    assert parse(looks_like_github, source=IssueSource.SENTRY_EVENT).error_type == "KeyError"


def test_named_text_source_takes_json_as_text() -> None:
    issue = parse_payload('{"title": "x"}\nmore', IssueSource.TEXT)

    assert (issue.title, issue.body) == ('{"title": "x"}', "more")


# --- Limits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_app", "kept"),
    [
        ("LLAAALLALL", [2, 3, 4, 7, 9]),  # every in-app frame, then the library frame last
        ("ALLLLLLLAA", [0, 6, 7, 8, 9]),  # in-app frames, then library frames nearest the raise
        ("AAAAAAALLL", [2, 3, 4, 5, 6]),  # too many in-app: those nearest the raise
    ],
)
def test_the_frame_cap_keeps_in_app_frames_first_and_the_original_order(
    in_app: str, kept: list[int]
) -> None:
    frames = [sdk_frame(f"f{i}.py", i + 1, "f", in_app=c == "A") for i, c in enumerate(in_app)]

    issue = parse(sdk_event(*frames), limits=IntakeLimits(max_frames=5))

    assert [frame.file for frame in issue.frames] == [f"f{i}.py" for i in kept]


def test_over_long_strings_are_cut_with_a_marker_saying_how_much_was_cut() -> None:
    frame = {**sdk_frame("a.py", 1, "f"), "context_line": "c" * 40}
    event = sdk_event(frame, title="t" * 25, tags={"k" * 12: "v" * 30})
    event["exception"]["values"][0]["value"] = "m" * 50
    limits = IntakeLimits(
        max_title_chars=10, max_message_chars=20, max_context_line_chars=30, max_tag_chars=10
    )

    issue = parse(event, limits=limits)

    assert issue.title == "tttttttttt…[cut 15 chars]"
    assert issue.error_message == "m" * 20 + "…[cut 30 chars]"
    assert issue.frames[0].context_line == "c" * 30 + "…[cut 10 chars]"
    assert issue.tags == {"kkkkkkkkkk…[cut 2 chars]": "vvvvvvvvvv…[cut 20 chars]"}


def test_an_over_long_body_is_cut_with_a_marker() -> None:
    issue = parse_payload("Title\n" + "b" * 100, limits=IntakeLimits(max_body_chars=60))

    assert issue.body == "b" * 60 + "…[cut 40 chars]"


def test_tags_and_links_are_capped_in_order() -> None:
    labels = [f"l{i}" for i in range(5)]
    payload = {**GITHUB_ISSUE, "labels": labels, "state": None, "user": None}

    issue = parse(payload, limits=IntakeLimits(max_tags=3, max_links=0))

    assert issue.tags == {"label:l0": "true", "label:l1": "true", "label:l2": "true"}
    assert issue.links == []


def test_control_characters_are_removed_and_hostile_text_is_kept_as_data() -> None:
    text = "Crash \x1b[31mred\x1b[0m\x00\x07 {issue} $(rm -rf /)\r\nline\twith tab\nnext\x7f\x85"

    issue = parse_payload(text)

    assert issue.title == "Crash [31mred[0m {issue} $(rm -rf /)"
    assert issue.body == "line\twith tab\nnext"


def test_control_characters_are_removed_from_json_strings_too() -> None:
    event = sdk_event({**sdk_frame("a\x00.py", 1, "f\x1bn"), "context_line": "x = 1\x08\r"})

    frame = parse(event).frames[0]

    assert (frame.file, frame.function, frame.context_line) == ("a.py", "fn", "x = 1")


def test_links_that_are_not_http_urls_are_dropped() -> None:
    payload = {**GITHUB_ISSUE, "html_url": "javascript:alert(1)"}

    assert parse(payload).links == []


# --- The demo's Sentry event -------------------------------------------------------------------


def assert_is_the_sample_crash(issue: Issue) -> None:
    assert issue.source == IssueSource.SENTRY_EVENT
    assert issue.error_type == "ZeroDivisionError"
    assert issue.error_message == "integer division or modulo by zero"
    raising = issue.frames[-1]
    assert (raising.file, raising.function, raising.in_app) == (
        "shopcart/cart.py",
        "average_price_cents",
        True,
    )
    assert raising.context_line == "        return self.total_cents() // self.item_count()"
    assert ("shopcart/checkout.py", "summary", True) in [
        (f.file, f.function, f.in_app) for f in issue.frames
    ]
    assert issue.culprit == "shopcart.cart in average_price_cents"


def test_the_bundled_sentry_event_is_the_sample_repos_crash() -> None:
    assert_is_the_sample_crash(parse_payload(SENTRY_EVENT.read_bytes()))


def test_make_sentry_event_reproduces_the_sample_crash_with_the_real_sdk(tmp_path: Path) -> None:
    out = tmp_path / "event.json"

    subprocess.run(
        [sys.executable, "-m", "demo.make_sentry_event", "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )

    text = out.read_text()
    assert_is_the_sample_crash(parse_payload(text))
    event = json.loads(text)
    assert event["sdk"]["name"] == "sentry.python"
    assert not {"server_name", "modules"} & event.keys()
    assert str(PROJECT_ROOT) not in text


# --- Refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (b'{"exception": {"values": [}', None, "malformed JSON at line 1, column 27"),
        (b'\n  {"title": "x",\n}', None, "malformed JSON at line 3, column 1"),
        (b"[" * 100_000, None, "nested too deeply"),
        (b'{"event_id": ' + b"9" * 5_000 + b"}", None, "number too long"),
        (b"\xff\xfe oops", None, "not valid UTF-8 (byte 0xff at offset 0"),
        (b"Caf\xe9 crashed", None, "not valid UTF-8 (byte 0xe9 at offset 3"),
        (b'[{"event_id": "e1"}]', None, "expected a JSON object, got a list"),
        (b'  ["just", "a", "list"]', None, "expected a JSON object, got a list"),
        (b" \n\t \r\n", None, "the report is empty"),
        (b'{"hello": "world"}', None, "unrecognised JSON object (keys: 'hello')"),
        (b'{"event_id": "e1", "message": "hi"}', "exception", "needs exception.values[]"),
        (b'{"exception": {"values": []}}', "exception", "at least one exception"),
        (b'{"entries": [{"type": "message", "data": {}}]}', "exception", "exception.values[]"),
        (b'{"shortId": "SHOP-1", "title": "x"}', "latestEvent", "must carry its latest event"),
        (b'{"shortId": "S", "latestEvent": {"message": "hi"}}', "latestEvent.exception", "needs"),
        (b'{"number": 1, "html_url": "https://github.com/a/b/issues/1"}', "title", "title"),
        (b'{"action": "opened", "issue": {"number": 1, "title": null}}', "issue.title", "title"),
        (b'{"action": "opened", "issue": {"number": 1, "title": " \\t "}}', "issue.title", "blank"),
        (b'{"action": "opened", "issue": {"title": "x"}}', "issue.number", "number"),
    ],
)
def test_bad_payloads_are_refused_with_a_message_naming_what_was_wrong(
    data: bytes, field: str | None, words: str
) -> None:
    with pytest.raises(IntakeError) as refused:
        parse_payload(data)

    assert refused.value.field == field
    assert words in refused.value.message


def test_an_unrecognised_object_is_refused_with_the_accepted_shapes() -> None:
    with pytest.raises(IntakeError, match=r"Sentry event .* GitHub issue object .* webhook"):
        parse({"title": "x", "body": "y"})


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (
            {"action": "created", "issue": {"number": 5, "title": "x", "pull_request": {}}},
            "issue.pull_request",
        ),
        ({"number": 5, "title": "Fix", "html_url": "https://github.com/a/b/pull/5"}, "html_url"),
    ],
    ids=["comment-on-a-pull-request", "issue-object-of-a-pull-request"],
)
def test_a_pull_request_is_refused_as_not_an_issue(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(IntakeError, match="pull request, not an issue") as refused:
        parse(payload)

    assert refused.value.field == field


def test_a_payload_over_the_size_limit_is_refused_before_parsing() -> None:
    data = b"{" + b" " * 20_000_000  # would be malformed JSON if it were parsed

    with pytest.raises(PayloadTooLargeError) as refused:
        parse_payload(data)

    assert str(refused.value) == (
        "the payload is 20,000,001 bytes, over the intake limit of 2,000,000 bytes; "
        "send a smaller report (the stack trace and the message are what matter)"
    )


def test_a_text_payload_is_measured_in_utf8_bytes() -> None:
    with pytest.raises(PayloadTooLargeError, match="6 bytes, over the intake limit of 5 bytes"):
        parse_payload("ééé", limits=IntakeLimits(max_payload_bytes=5))


@pytest.mark.parametrize(
    ("event", "field", "words"),
    [
        (
            {"exception": {"values": [{"type": "E", "stacktrace": {"frames": "a.py:3"}}]}},
            "exception.values[0].stacktrace.frames",
            "expected a list, got a string",
        ),
        (
            sdk_event(sdk_frame("a.py", 1, "f"), {"filename": "b.py", "lineno": "12"}),
            "exception.values[0].stacktrace.frames[1].lineno",
            "expected a whole number, got a string",
        ),
        (
            sdk_event({"filename": "b.py", "in_app": "yes"}),
            "exception.values[0].stacktrace.frames[0].in_app",
            "expected true or false, got a string",
        ),
        (
            sdk_event({"filename": 7}),
            "exception.values[0].stacktrace.frames[0].filename",
            "expected a string, got a number",
        ),
        (
            {"exception": {"values": ["KeyError"]}},
            "exception.values[0]",
            "expected an object, got a string",
        ),
        (
            {"exception": {"values": [{"stacktrace": {"frames": []}}]}},
            "exception.values[0]",
            "needs a type or a value",
        ),
        (
            sdk_event(tags=[["a", "b"], "c=d"]),
            "tags[1]",
            "expected a [key, value] pair or a {key, value} object, got a string",
        ),
        (
            sdk_event(tags={"a": ["b"]}),
            "tags.a",
            "expected a tag value (a string), got a list",
        ),
        (
            api_event({"filename": "a.py", "lineNo": 2, "context": [[2]]}),
            "entries[0].data.values[0].stacktrace.frames[0].context[0]",
            "expected a [line number, source line] pair, got a list",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_with_its_dotted_path(
    event: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(IntakeError) as refused:
        parse(event, source=IssueSource.SENTRY_EVENT)

    assert refused.value.field == field
    assert words in refused.value.message


def test_a_github_label_of_the_wrong_type_is_refused_with_its_path() -> None:
    with pytest.raises(IntakeError) as refused:
        parse({**GITHUB_ISSUE, "labels": ["bug", 3]})

    assert refused.value.field == "labels[1]"


def test_intake_errors_survive_pickling() -> None:
    with pytest.raises(IntakeError) as refused:
        parse({"event_id": "e1"})

    copy = pickle.loads(pickle.dumps(refused.value))

    assert (copy.message, copy.field) == (refused.value.message, "exception")
