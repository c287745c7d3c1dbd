"""Test outcomes by id, read from the real output of pytest, unittest and `node --test`: each
runner is run here on a small suite whose outcomes the test knows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers.outcomes import Outcome, parse, with_ids

PYTEST_SUITE = """
import pytest

def test_ok():
    assert True

def test_broken():
    assert 1 == 2

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1

@pytest.fixture
def bad():
    raise RuntimeError("setup")

def test_error(bad):
    pass

@pytest.mark.skip(reason="later")
def test_skipped():
    pass

class TestGroup:
    def test_inside(self):
        pass
"""

UNITTEST_SUITE = '''
import unittest

class CartTest(unittest.TestCase):
    def test_ok(self):
        pass

    def test_documented(self):
        """A docstring's first line is printed between the name and the outcome."""
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("later")
    def test_skipped(self):
        pass

    def test_warns(self):
        """A warning is printed between the test's name and its outcome."""
        import warnings
        warnings.warn("an old API", DeprecationWarning)
'''

NODE_SUITE = """
const test = require('node:test');
const assert = require('node:assert');
test('adds', () => { assert.strictEqual(1 + 1, 2); });
test('breaks', () => { assert.strictEqual(1, 2); });
test('group', async (t) => {
  await t.test('inner ok', () => {});
  await t.test('inner broken', () => { throw new Error('no'); });
});
test('later', { skip: true }, () => {});
"""


def run(argv: list[str], cwd: Path) -> str:
    """What the command prints. A pytest run loads none of this environment's plugins
    (hypothesis, xdist, anyio, ...): they do not change what it prints of the suite's outcomes
    and would take most of its time."""
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def test_pytest_outcomes_are_read_by_node_id(tmp_path: Path) -> None:
    (tmp_path / "test_shop.py").write_text(PYTEST_SUITE)
    command = with_ids(f"{sys.executable} -m pytest -p no:cacheprovider")

    outcomes = parse(run(command.split(), tmp_path))

    assert outcomes.runner == "pytest"
    assert outcomes.passed == [
        "test_shop.py::TestGroup::test_inside",
        "test_shop.py::test_ok",
        "test_shop.py::test_param[1]",
    ]
    assert outcomes.failed == [
        "test_shop.py::test_broken",
        "test_shop.py::test_error",
        "test_shop.py::test_param[2]",
    ]


def test_unittest_outcomes_are_read_by_dotted_name(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_cart.py").write_text(UNITTEST_SUITE)
    command = with_ids(f"{sys.executable} -m unittest discover -s tests -t .")

    outcomes = parse(run(command.split(), tmp_path))

    assert outcomes.runner == "unittest"
    assert outcomes.by_id == {
        "tests.test_cart.CartTest.test_ok": Outcome.PASSED,
        "tests.test_cart.CartTest.test_documented": Outcome.FAILED,
        "tests.test_cart.CartTest.test_error": Outcome.FAILED,
        "tests.test_cart.CartTest.test_skipped": Outcome.SKIPPED,
        "tests.test_cart.CartTest.test_warns": Outcome.PASSED,
    }


def test_node_test_runner_tap_is_read_with_subtests_nested(tmp_path: Path) -> None:
    (tmp_path / "shop.test.js").write_text(textwrap.dedent(NODE_SUITE))

    outcomes = parse(run(["node", "--test", "--test-reporter=tap", "shop.test.js"], tmp_path))

    assert outcomes.runner == "tap"
    assert outcomes.by_id == {
        "adds": Outcome.PASSED,
        "breaks": Outcome.FAILED,
        "group > inner ok": Outcome.PASSED,
        "group > inner broken": Outcome.FAILED,
        "later": Outcome.SKIPPED,
    }


def test_spec_reporters_check_marks_are_read() -> None:
    mocha = "\n  cart\n    ✔ adds (3ms)\n    ✓ totals\n    1) divides\n\n  2 passing\n  1 failing\n"

    outcomes = parse(mocha)

    assert (outcomes.runner, outcomes.passed, outcomes.failed) == (
        "spec",
        ["cart > adds", "cart > totals"],
        ["cart > divides"],
    )


def test_mochas_failure_details_after_its_summary_name_no_test_of_their_own() -> None:
    mocha = (
        "\n  cart\n    ✔ adds\n    1) divides\n\n  1 passing (4ms)\n  1 failing\n\n"
        "  1) cart\n       divides:\n     AssertionError: expected 1 to equal 2\n"
    )

    assert parse(mocha).by_id == {"cart > adds": Outcome.PASSED, "cart > divides": Outcome.FAILED}


def test_jest_tests_of_one_name_in_two_files_or_groups_are_two_tests() -> None:
    jest = (
        "PASS test/unit/v1.test.js\n  v1\n    ✓ explicit options (3 ms)\n"
        "    nested\n      ✓ explicit options\n"
        "FAIL test/unit/v4.test.js\n  v4\n    ✓ explicit options (1 ms)\n    ✕ rng (2 ms)\n\n"
        "  ● v4 › rng\n\n    expect(received).toBe(expected)\n\n"
        "Tests:       1 failed, 3 passed, 4 total\n"
    )

    assert parse(jest).by_id == {
        "test/unit/v1.test.js > v1 > explicit options": Outcome.PASSED,
        "test/unit/v1.test.js > v1 > nested > explicit options": Outcome.PASSED,
        "test/unit/v4.test.js > v4 > explicit options": Outcome.PASSED,
        "test/unit/v4.test.js > v4 > rng": Outcome.FAILED,
    }


def test_output_that_names_no_test_has_no_outcomes() -> None:
    assert parse("Traceback (most recent call last):\nImportError: no module named x\n").by_id == {}


@pytest.mark.parametrize(
    ("command", "asked"),
    [
        ("python -m pytest", "python -m pytest -rA"),
        ("pytest -q tests", "pytest -q tests -rA"),
        ("python -m pytest -rfE", "python -m pytest -rfE"),
        ("python3 -m unittest discover -s tests", "python3 -m unittest discover -s tests -v"),
        ("npm test", "npm test"),
    ],
)
def test_the_command_is_asked_to_name_its_tests(command: str, asked: str) -> None:
    assert with_ids(command) == asked
