"""Scripted policies the fake Gemini server plays for an evaluation, one script per instance.

* **oracle**: writes the instance's own tests (`test.patch`) as the reproduction and applies its
  gold patch as the fix, through the real tools; it must resolve every instance.
* **stale**: a reproduction by tests that already pass (the instance's first PASS_TO_PASS
  test), then the gold patch: Baton must refuse the reproduction, so nothing is published.
* **saboteur**: a plausible wrong fix. Its reproduction is a test of its own that the "fix"
  satisfies (a marker comment in the file the gold patch changes); the bug stays. The proof
  must refuse it (a comment changes no code that runs, `workers.substance`), so nothing is
  published; the harness's independent measurement, with the instance's hidden tests, must
  find it unresolved either way: proof that the harness can fail.

The fake server plays one scenario for the whole fleet, so each instance's steps are a script
*variant* chosen by the instance's issue title, which every stage's instruction holds (the
report itself, or the triage and plan outputs these policies write, which quote it).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from evaluation.corpus import Instance
from workers.proof import is_test_file, split_diff

Mode = Literal["oracle", "saboteur", "stale"]
STAGES = ("triage", "search", "plan", "reproduce", "fix", "review", "pr")
SABOTEUR_TEST = "tests/test_baton_saboteur.py"
SABOTEUR_MARK = "baton-saboteur: handled"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.MULTILINE)


def scenario(instances: list[Instance], mode: Mode) -> dict[str, Any]:
    """The fake server's scenario: per stage, a variant per instance; a request no variant
    claims gets a reply that fails its stage (so a mix-up shows, never passes)."""
    unclaimed = [{"text": "this request matched no evaluation instance"}]
    agents: dict[str, Any] = {
        stage: {"steps": unclaimed, "variants": []} for stage in (*STAGES, "compactor")
    }
    for instance in instances:
        for stage, steps in script(instance, mode).items():
            agents[stage]["variants"].append({"when": instance.title, "steps": steps})
    return {"agents": agents}


def script(instance: Instance, mode: Mode) -> dict[str, list[dict[str, Any]]]:
    """Each stage's steps for one instance."""
    gold = instance.text("gold.patch")
    files = list(split_diff(gold))
    first, (start, length) = files[0], _first_hunk(gold)
    title = instance.title
    repro = _reproduction(instance, mode, files[0])
    return {
        "triage": [{"json": {
            "actionable": True, "reason": f"A defect in the repository's code: {title}",
            "severity": "medium", "error_summary": title, "suspected_files": files,
            "keywords": [],
        }}],
        "search": [
            {"call": {"name": "read_file", "args": {"path": first, "start_line": max(1, start),
                                                     "end_line": start + max(length, 1)}}},
            {"json": {
                "root_cause": f"{title}: the code in {first} around line {start}.",
                "locations": [{"path": first, "line_start": max(1, start),
                               "line_end": start + max(length, 1), "why": title}],
                "related_tests": list(instance.tests.fail_to_pass),
            }},
        ],
        "plan": [{"json": {
            "approach": f"Fix {title} where the search found it.",
            "steps": ["Reproduce it with a test.", "Change the code.", "Run the tests."],
            "files_to_change": files,
            "test_command": repro["test_command"],
        }}],
        "reproduce": [
            repro["write"],
            {"json": {
                "test_files": repro["test_files"], "test_command": repro["test_command"],
                "expected_failure": repro["expected_failure"],
                "explanation": f"The test shows: {title}",
            }},
        ],
        "fix": [
            _fix_step(instance, mode, first),
            {"json": {
                "summary": f"Fixed {title}.", "files_changed": files,
                "test_command": repro["test_command"], "tests_passed": True,
            }},
        ],
        # The review approves whatever it is shown, in every mode: a scripted reviewer that
        # refused the saboteur would be the evaluation grading itself, so what stops a saboteur
        # here is Baton's measured checks alone (the review's worth needs a real model).
        "review": [{"json": {"reproduces_report": True, "fixes_cause": True, "problems": []}}],
        "pr": [
            {"call": {"name": "publish", "args": {"title": f"Fix: {title}"[:120],
                                                  "body": f"Fixes: {title}"}}},
            {"json": {"branch": "{{fn:publish.branch}}", "commit": "{{fn:publish.commit}}",
                      "title": f"Fix: {title}"[:120], "body": f"Fixes: {title}"}},
        ],
        "compactor": [{"text": "{}"}],
    }  # fmt: skip


def command_for(instance: Instance, ids: list[str]) -> str:
    """A command that runs just `ids`: the instance's own test command given their node ids
    (pytest; its options stay, such as a `--no-cov` that keeps a coverage threshold from failing
    a run of a few tests), or told to keep only them (unittest: `-k`, which matches a test's
    dotted name)."""
    if instance.tests.runner == "unittest":
        own = str(instance.environment.get("test") or "python -m unittest")
        return own + "".join(f" -k {shlex.quote(i)}" for i in ids)
    own = str(instance.environment.get("test") or "python -m pytest")
    return f"{own} -p no:cacheprovider " + " ".join(shlex.quote(i) for i in ids)


def _reproduction(instance: Instance, mode: Mode, first: str) -> dict[str, Any]:
    if mode == "oracle":
        ids = list(instance.tests.fail_to_pass)
        patch = instance.text("test.patch")
        expected = instance.expected_failure or re.split(r"::|\.", ids[0].split("[")[0])[-1]
        return {
            "write": {"call": {"name": "apply_patch", "args": {"patch": patch}}},
            "test_files": list(split_diff(patch)),
            "test_command": command_for(instance, ids),
            "expected_failure": expected,
        }
    if mode == "stale":
        passing = [_stale_test(instance)]
        return {
            "write": {"call": {"name": "list_files", "args": {"path": "."}}},
            "test_files": list(split_diff(instance.text("test.patch")))[:1],
            "test_command": command_for(instance, passing),
            "expected_failure": "Error",
        }
    test = (
        "import unittest\nfrom pathlib import Path\n\n\n"
        "class ReportedFailureTest(unittest.TestCase):\n"
        "    def test_the_reported_failure_is_handled(self):\n"
        f"        source = Path({first!r}).read_text()\n"
        f"        self.assertIn({SABOTEUR_MARK!r}, source, 'NotHandledError')\n"
    )
    write = {"path": SABOTEUR_TEST, "old_text": "", "new_text": test}
    command = (
        command_for(instance, ["test_baton_saboteur"])
        if instance.tests.runner == "unittest"
        else f"python -m pytest -p no:cacheprovider {SABOTEUR_TEST}"
    )
    return {
        "write": {"call": {"name": "edit_file", "args": write}},
        "test_files": [SABOTEUR_TEST],
        "test_command": command,
        "expected_failure": "NotHandledError",
    }


def _stale_test(instance: Instance) -> str:
    """The first PASS_TO_PASS test in a test file (not a doctest, which needs the suite's own
    options to be collected)."""
    for test_id in instance.tests.pass_to_pass:
        if instance.tests.runner == "unittest" or is_test_file(test_id.split("::")[0]):
            return test_id
    raise ValueError(f"instance {instance.id} has no PASS_TO_PASS test in a test file")


def _fix_step(instance: Instance, mode: Mode, first: str) -> dict[str, Any]:
    gold = instance.text("gold.patch")
    if mode == "oracle":
        return {"call": {"name": "apply_patch", "args": {"patch": gold}}}
    # A comment after the first line the gold patch's first hunk shows of the unchanged file:
    # the right file, near the right place, and no fix.
    start, _ = _first_hunk(gold)
    body = gold[_HUNK.search(gold).end() :].splitlines()[1:]  # type: ignore[union-attr]
    line = next(ln[1:] for ln in body if ln[:1] in (" ", "-"))
    wrong = (
        f"diff --git a/{first} b/{first}\n--- a/{first}\n+++ b/{first}\n"
        f"@@ -{start},1 +{start},2 @@\n {line}\n+# {SABOTEUR_MARK}\n"
    )
    return {"call": {"name": "apply_patch", "args": {"patch": wrong}}}


def _first_hunk(patch: str) -> tuple[int, int]:
    found = _HUNK.search(patch)
    if found is None:
        return 1, 1
    return int(found.group(1)), int(found.group(2) or 1)
