"""What the fake Gemini server plays for `fixer-plus` on the demo's repository: the demo's
scenario with a middling fixability score (the plan is gated), one search child per suspected
file, and three different fixes, one per branch of the fix stage: `b1` wrong (its proof fails),
`b2` right, `b3` right with a larger diff. Selection by proof must keep `b2`.

Each child reads its file and answers with a summary that starts with `CHILD_MARK`, so a test
can follow the summary into the parent's request and look for the child's tool traffic there.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from demo import SCENARIO

RIGHT = (
    "        count = self.item_count()\n"
    "        if count == 0:\n"
    "            return 0\n"
    "        return self.total_cents() // count\n"
)
WRONG = "        return -1\n"
LONGER = (
    "        count = self.item_count()\n"
    "        if count == 0:  # an empty cart has no average: its docstring says 0\n"
    "            return 0\n"
    "        return self.total_cents() // count\n"
)
FIXES = {"b1": WRONG, "b2": RIGHT, "b3": LONGER}
SELECTED = "b2"
SUSPECTED = {"cart": "shopcart/cart.py", "checkout": "shopcart/checkout.py"}
"""The search children by name, each with the file it reads."""
CHILD_MARK = "CHILD-SUMMARY"
FIXABILITY = 0.5
"""Below `fixer-plus`'s threshold: a person approves the plan."""


def branch_marker(branch: str) -> str:
    """What a fix branch's system instruction holds, and no other branch's."""
    return f"attempt {branch} "


def scenario() -> dict[str, Any]:
    demo: dict[str, Any] = json.loads(SCENARIO.read_text())
    agents = demo["agents"]
    agents["triage"]["steps"][0]["json"]["fixability"] = FIXABILITY
    delegations = [
        {"name": "delegate",
         "args": {"goal": f"Find the fault in {path}", "name": name, "paths": [path]}}
        for name, path in SUSPECTED.items()
    ]  # fmt: skip
    agents["search"]["steps"] = [{"calls": delegations}, *agents["search"]["steps"]]
    for name, path in SUSPECTED.items():
        agents[f"sub_{name}"] = [
            {"call": {"name": "read_file",
                      "args": {"path": path, "start_line": 1, "end_line": 40}}},
            {"json": {"summary": f"{CHILD_MARK} {path}: the division by item_count() is here",
                      "findings": []}},
        ]  # fmt: skip
    right = agents["fix"]["steps"]

    def fix(new_text: str) -> list[dict[str, Any]]:
        steps = copy.deepcopy(right)
        steps[1]["call"]["args"]["new_text"] = new_text
        return steps

    agents["fix"] = {
        "steps": fix(RIGHT),
        "variants": [{"when": branch_marker(b), "steps": fix(text)} for b, text in FIXES.items()],
    }
    return demo
