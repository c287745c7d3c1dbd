"""Where the reviewer's comments may go: the lines of the pull request's diff, as GitHub reads
them; every other comment moved into the review's body with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.pipelines.reviewer.diff import (
    MOVED_HEADING,
    Moved,
    commentable_lines,
    place_comments,
    review_body,
)
from orchestrator.pipelines.reviewer.schemas import ReviewComment

# GitHub's `patch` of shopcart/cart.py in the demo's pull request: two hunks, the new side's
# lines 2–11 and 33–41; line 39 is the added `if`.
CART_PATCH = """@@ -2,6 +2,10 @@
 
 from dataclasses import dataclass, field
 
+BULK_UNITS = 10
+\"\"\"A cart of this many units or more gets the bulk discount.\"\"\"
+BULK_DISCOUNT_PERCENT = 10
+
 
 @dataclass(frozen=True)
 class Item:
@@ -29,3 +33,9 @@ class Cart:
         if count == 0:
             return 0
         return self.total_cents() // count
+
+    def bulk_discount_cents(self) -> int:
+        \"\"\"The bulk discount: 10% of the total, rounded down, for 10 units or more.\"\"\"
+        if self.item_count() > BULK_UNITS:
+            return self.total_cents() * BULK_DISCOUNT_PERCENT // 100
+        return 0"""
REMOVALS_PATCH = """@@ -10,5 +10,3 @@ def f():
 keep = 1
-gone = 2
-also_gone = 3
 kept = 4
 last = 5
\\ No newline at end of file"""


def comment(path: str, line: int, **over: Any) -> ReviewComment:
    return ReviewComment.model_validate(
        {"path": path, "line": line, "severity": "high", "text": "t", **over}
    )


def test_the_commentable_lines_are_the_added_and_context_lines_of_each_hunk() -> None:
    assert commentable_lines(CART_PATCH) == set(range(2, 12)) | set(range(33, 42))


def test_removed_lines_and_the_no_newline_marker_take_no_line_of_the_head() -> None:
    assert commentable_lines(REMOVALS_PATCH) == {10, 11, 12}


def test_a_comment_on_a_line_the_diff_shows_stays_on_it() -> None:
    placed, moved = place_comments([comment("shopcart/cart.py", 39)],
                                   {"shopcart/cart.py": CART_PATCH})  # fmt: skip

    assert (placed, moved) == ([comment("shopcart/cart.py", 39)], [])


@pytest.mark.parametrize(
    ("wanted", "patches", "reason"),
    [
        (comment("shopcart/cart.py", 25), {"shopcart/cart.py": CART_PATCH},
         "line 25 of shopcart/cart.py is not in the diff, which shows lines 2–11, 33–41 of it"),
        (comment("shopcart/__init__.py", 3), {"shopcart/cart.py": CART_PATCH},
         "shopcart/__init__.py is not changed by the pull request"),
        (comment("logo.png", 1), {"logo.png": None},
         "GitHub shows no diff of logo.png (binary or too large)"),
    ],
    ids=["a line outside the hunks", "a file the change leaves alone", "a binary file"],
)  # fmt: skip
def test_a_comment_that_cannot_sit_on_its_line_is_moved_with_the_reason(
    wanted: ReviewComment, patches: dict[str, str | None], reason: str
) -> None:
    placed, moved = place_comments([wanted], patches)

    assert (placed, moved) == ([], [Moved(wanted, reason)])


def test_a_path_written_from_the_current_folder_is_the_diff_s_path() -> None:
    placed, _ = place_comments([comment("./shopcart/cart.py", 5)], {"shopcart/cart.py": CART_PATCH})

    assert [c.path for c in placed] == ["shopcart/cart.py"]


def test_the_body_holds_the_summary_the_moved_comments_with_reasons_and_the_marker() -> None:
    moved = [Moved(comment("a.py", 3, severity="low", text="Cache it."), "a.py is not changed")]

    body = review_body("  Looks wrong.\n", moved, "<!-- marker -->")

    assert body == (
        f"Looks wrong.\n\n**{MOVED_HEADING}**\n\n"
        "- `a.py:3` **low**: Cache it. _(moved here: a.py is not changed)_\n\n<!-- marker -->"
    )
    assert review_body("Fine.", [], "<!-- marker -->") == "Fine.\n\n<!-- marker -->"
