"""Whether a change changes code that runs (`workers.substance`)."""

from __future__ import annotations

import pytest

from workers.substance import code_unchanged, only_inert

CART = '''"""Cart totals."""


def total(items):
    return sum(price * count for price, count in items)
'''


@pytest.mark.parametrize(
    ("after", "why"),
    [
        (CART.replace("    return", "    # BATON-FIX: totals checked\n    return"), "a comment"),
        (CART.replace("def total(items):", 'def total(items):\n    """Sum."""'), "a docstring"),
        (CART.replace('"""Cart totals."""', '"""Cart totals, fixed."""'), "the module's docstring"),
        (CART.replace("price * count", "price*count") + "\n\n", "layout and blank lines"),
        (CART.replace("    return", '    "a bare string does nothing"\n    return'), "a no-op"),
    ],
)
def test_a_python_change_to_what_never_runs_changes_no_code(after: str, why: str) -> None:
    assert code_unchanged("shop/cart.py", CART, after), why


@pytest.mark.parametrize(
    "after",
    [
        CART.replace("price * count", "price * count * 2"),
        CART.replace("sum(", "int(sum(").replace("items)\n", "items))\n"),
        CART.replace("def total(items):", "def total(items):\n    pass"),
        CART.replace('"""Cart totals."""', 'DOC = "Cart totals."'),  # a string given a name
        CART + "    x = (\n",  # does not parse: cannot be judged
    ],
)
def test_a_python_change_to_what_runs_is_code(after: str) -> None:
    assert not code_unchanged("shop/cart.py", CART, after)


C_SOURCE = "static int escape(const char *s) {\n    return strlen(s) + 1; /* NUL */\n}\n"


@pytest.mark.parametrize(
    "after",
    [
        C_SOURCE.replace("/* NUL */", "// the terminating NUL, see #12"),
        C_SOURCE.replace("{\n    return", "{\n  /* fixed */\n    return"),
        C_SOURCE.replace("strlen(s) + 1", "strlen( s )+1"),
    ],
)
def test_a_c_family_change_to_comments_or_layout_changes_no_code(after: str) -> None:
    assert code_unchanged("src/escape.c", C_SOURCE, after)
    assert code_unchanged("lib/escape.ts", C_SOURCE, after)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (C_SOURCE, C_SOURCE.replace("+ 1", "+ 2")),
        ('const url = "http://a";', 'const url = "http://b";'),  # `//` in a string is no comment
        ('s = "a  b";', 's = "a b";'),  # whitespace in a string is data
        ("int x;", "intx;"),  # a space between two words is code
        ("s = 'it''s'; // x", "s = 'it''t'; // x"),
    ],
)
def test_a_c_family_change_to_code_or_string_literals_is_code(before: str, after: str) -> None:
    assert not code_unchanged("app.js", before, after)


def test_files_of_other_kinds_are_never_judged_inert() -> None:
    assert not code_unchanged("data/rates.json", '{"eur": 1}', '{"eur": 1}\n')
    assert not code_unchanged("README.md", "# Shop\n", "# Shop\n\n")


def test_a_new_file_of_only_comments_and_a_removed_one_are_judged_by_what_they_hold() -> None:
    assert code_unchanged("shop/notes.py", None, "# nothing to see\n")
    assert not code_unchanged("shop/cart.py", CART, None)


def test_a_change_is_inert_only_if_every_file_of_it_is() -> None:
    before = {"shop/cart.py": CART, "shop/tax.py": "RATE = 1\n"}
    comment = {"shop/cart.py": "# fixed\n" + CART}

    assert only_inert(before, comment) == ["shop/cart.py"]
    assert only_inert(before, {**comment, "shop/tax.py": "RATE = 2\n"}) == []
    assert only_inert(before, {}) == []


CYTHON_SOURCE = (
    "cdef class Lookup:\n    cdef int hits  # how often\n\n    def get(self, key):\n"
    '        s = "a # b"\n        return self.hits\n'
)


@pytest.mark.parametrize(
    ("after", "inert"),
    [
        (CYTHON_SOURCE.replace("    def get", "    # baton-saboteur: handled\n    def get"), True),
        (CYTHON_SOURCE + "\n\n   \n", True),
        (CYTHON_SOURCE.replace("a # b", "a # c"), False),  # `#` in a string is data
        (CYTHON_SOURCE.replace("return self.hits", "return self.hits + 1"), False),
        (CYTHON_SOURCE.replace("        return", "    return"), False),  # indentation is code
    ],
)
def test_a_cython_change_is_judged_without_its_comments_and_blank_lines(
    after: str, inert: bool
) -> None:
    assert code_unchanged("propcache/_helpers_c.pyx", CYTHON_SOURCE, after) is inert
