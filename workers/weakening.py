"""Whether a change weakens the tests that hold it to account, by the test ids and outcomes of
the proof's runs (`workers.outcomes`), whatever it did to the test files' text.

* The reproducing tests that failed when the reproduction was measured must still fail with
  only the change's test files applied: otherwise the change altered them (loosened an
  assertion, skipped or deleted the test).
* The reproducing tests that fail without the change's code must pass with it, not be skipped
  or go missing (a skip marker, an `xfail`, a deselection).
* A test of the suite that ran (passed or failed) without the change's code must run with it:
  not be skipped, xfailed or gone. (The proof runs the suite without the change's code with the
  repository's own test files as they were, bar the reproduction's and new ones, so a test file
  the change edits is compared with what it was.)
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.outcomes import Outcome, Outcomes

SHOWN = 5


def _named(ids: Sequence[str]) -> str:
    more = f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else ""
    return ", ".join(ids[:SHOWN]) + more


def weakened(
    reproduced: Sequence[str],
    repro_before: Outcomes,
    repro_after: Outcomes,
    suite_before: Outcomes | None,
    suite_after: Outcomes | None,
) -> str | None:
    """Why the change weakens the tests (module docstring), or None. `reproduced`: the test ids
    that failed when the reproduction was measured; the rest: the proof's runs without the
    change's code (`_before`) and with it (`_after`)."""
    before = repro_before.by_id
    altered = [i for i in reproduced if before.get(i) != Outcome.FAILED]
    if altered:
        return (
            f"the change weakens the tests: {_named(altered)} failed when the reproduction ran, "
            "but with the change's test files alone they pass, are skipped or do not run: the "
            "change alters the reproducing tests; leave them as the reproduction wrote them "
            "and change the code"
        )
    after = repro_after.by_id
    dropped = [i for i in repro_before.failed if after.get(i) != Outcome.PASSED]
    if dropped and not repro_after.failed:
        return (
            f"the change weakens the tests: {_named(dropped)} fail without the change's code, "
            "and with it they are skipped or do not run instead of passing; make them pass"
        )
    if suite_before is None or suite_after is None or not suite_after.by_id:
        return None
    ran = {Outcome.PASSED, Outcome.FAILED}
    gone = sorted(
        i for i, o in suite_before.by_id.items() if o in ran and suite_after.by_id.get(i) not in ran
    )
    if gone:
        return (
            f"the change weakens the tests: {len(gone)} tests of the suite that ran without the "
            f"change's code are skipped or do not run with it: {_named(gone)}; a fix may not "
            "skip, xfail or remove tests"
        )
    return None
