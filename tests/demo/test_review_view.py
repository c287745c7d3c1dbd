"""The demo's table of review comments says where GitHub holds each one: on its line, in the
review's body, or nowhere."""

from __future__ import annotations

from rich.console import Console

from demo.review_view import IN_BODY, NOT_POSTED, ON_LINE, comments_table, where_posted

REVIEW = {
    "body": "Off by one.\n\n**Comments on lines outside the diff**\n\n- `a.py:25` **low**: x "
    "_(moved here: line 25 of a.py is not in the diff)_\n\n<!-- baton-review run=r -->",
    "comments": [{"path": "a.py", "line": 39, "side": "RIGHT", "body": "**high**: y"}],
}


def test_each_comment_is_where_github_holds_it() -> None:
    written = [
        {"path": "a.py", "line": 39},
        {"path": "./a.py", "line": 25},
        {"path": "a.py", "line": 2},
        {"path": "b.py", "line": 39},
    ]

    assert [where_posted(c, REVIEW) for c in written] == [ON_LINE, IN_BODY, NOT_POSTED, NOT_POSTED]


def test_the_table_has_a_row_a_comment_and_explains_the_body() -> None:
    written = [{"path": "a.py", "line": 39, "severity": "high", "text": "Use >=."},
               {"path": "a.py", "line": 25, "severity": "low", "text": "Twice."}]  # fmt: skip
    console = Console(width=100, record=True)

    console.print(comments_table(written, REVIEW))

    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert "a.py:39 high on its line Use >=." in lines
    assert "a.py:25 low in the body Twice." in lines
    assert any(line.startswith("in the body: the diff does not show that line") for line in lines)
