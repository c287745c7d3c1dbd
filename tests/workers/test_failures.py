"""What a failing test's output says it raised, and where (`workers.failures`)."""

from __future__ import annotations

import pytest

from workers.failures import on_stack, raised_types
from workers.outcomes import with_tracebacks

UNITTEST = """test_empty (tests.test_cart.CartTest.test_empty) ... ERROR

======================================================================
ERROR: test_empty (tests.test_cart.CartTest.test_empty)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/workspace/tests/test_cart.py", line 9, in test_empty
    self.assertEqual(Cart().average_price_cents(), 0)
                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/workspace/shopcart/cart.py", line 21, in average_price_cents
    return self.total_cents() // self.item_count()
           ~~~~~~~~~~~~~~~~~~~^^~~~~~~~~~~~~~~~~~~
ZeroDivisionError: integer division or modulo by zero

----------------------------------------------------------------------
Ran 1 test in 0.001s

FAILED (errors=1)
"""

PYTEST_LONG = """________________________________ test_empty ________________________________

    def test_empty():
>       assert Cart().average_price_cents() == 0

tests/test_cart.py:5:
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _

    def average_price_cents(self):
>       return self.total_cents() // self.item_count()
E       ZeroDivisionError: integer division or modulo by zero

shopcart/cart.py:21: ZeroDivisionError
=========================== short test summary info ============================
FAILED tests/test_cart.py::test_empty - ZeroDivisionError: integer division or modulo by zero
"""

PYTEST_ASSERT = """    def test_empty():
>       assert Cart().average_price_cents() == 1
E       assert 0 == 1

tests/test_cart.py:5: AssertionError
=========================== short test summary info ============================
FAILED tests/test_cart.py::test_empty - assert 0 == 1
"""

JEST = """  ● parse › rejects an empty version

    TypeError: Cannot read properties of undefined (reading 'split')

      at parse (src/parse.js:12:20)
      at Object.<anonymous> (test/parse.test.js:5:11)
"""


@pytest.mark.parametrize(
    ("output", "types"),
    [
        (UNITTEST, ["ZeroDivisionError"]),
        (PYTEST_LONG, ["ZeroDivisionError"]),
        (PYTEST_ASSERT, ["AssertionError"]),
        (JEST, ["TypeError"]),
        ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
         "shop.errors.CartError: no items\n", ["CartError"]),
        ("1 passed in 0.01s\n", []),
    ],
)  # fmt: skip
def test_the_exception_types_a_failure_shows_are_read_by_their_own_names(
    output: str, types: list[str]
) -> None:
    assert raised_types(output) == types


def test_a_stack_is_searched_for_the_function_by_its_whole_name() -> None:
    assert on_stack(UNITTEST, "average_price_cents")
    assert not on_stack(UNITTEST, "average_price")  # a prefix is another function
    assert not on_stack(UNITTEST, "summary")
    assert on_stack(JEST, "parse")
    assert not on_stack(PYTEST_LONG, "average_price_cents")  # pytest's long form names none


@pytest.mark.parametrize(
    ("command", "asked"),
    [
        ("python -m pytest tests/test_cart.py", "python -m pytest tests/test_cart.py --tb=native"),
        ("pytest -x --tb=short t.py", "pytest -x --tb=short t.py"),
        ("python -m unittest tests.test_cart", "python -m unittest tests.test_cart"),
    ],
)
def test_pytest_is_asked_for_pythons_own_tracebacks_unless_it_chose_a_form(
    command: str, asked: str
) -> None:
    assert with_tracebacks(command) == asked
