"""Which lines a test run executes, and whether a change touches any (`workers.trace`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.trace import (
    RECORD,
    TRACE_DIR,
    TRACER,
    Raised,
    executed,
    module_name,
    off_path,
    raised,
    touched_lines,
    traced,
)  # fmt: skip

CHANGE = """diff --git a/shop/cart.py b/shop/cart.py
--- a/shop/cart.py
+++ b/shop/cart.py
@@ -10,3 +10,3 @@ class Cart:
     def average(self):
-        return self.total() // self.count()
+        return self.total() // max(1, self.count())
         # done
@@ -40,0 +41,2 @@
+def added():
+    pass
"""


def test_a_diff_touches_what_it_changes_and_the_lines_either_side_of_an_insertion() -> None:
    assert touched_lines(CHANGE) == {11, 40, 41}  # the line replaced; both sides of the new
    assert touched_lines("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n") == set()


def test_an_insertion_between_a_blank_line_and_a_comment_touches_the_code_either_side() -> None:
    # more-itertools f51a53b: two lines inserted after a blank line, before a comment; neither
    # neighbour ever runs, the code beyond them does
    change = (
        "--- a/m.py\n+++ b/m.py\n@@ -10,4 +10,6 @@\n     total = sum(lengths)\n \n"
        "+    if not total:\n+        return\n     # the rest, evenly\n     step = total // n\n"
    )

    assert touched_lines(change) == {10, 11, 12, 13}


def test_a_removed_line_that_starts_with_dashes_is_a_removed_line_not_a_header() -> None:
    # `--x` removed shows as `---x`, `++x` added as `+++x`: inside a hunk both are code
    change = "--- a/m.py\n+++ b/m.py\n@@ -7,2 +7,2 @@\n x = 1\n---x\n+++x\n"

    assert touched_lines(change) == {8}


def test_a_change_is_off_the_path_only_when_no_touched_line_ran_and_all_can_be_judged() -> None:
    sections = {"shop/cart.py": CHANGE}

    assert off_path(sections, {"shop/cart.py": {1, 2, 3}})
    assert not off_path(sections, {"shop/cart.py": {11}})
    assert not off_path(sections, {"shop/cart.py": {41}})  # beside the insertion
    # a C file the tracer cannot see, or a new file the old code could not run: not judged
    assert not off_path({**sections, "src/speedups.c": CHANGE}, {})
    assert not off_path({"shop/new.py": "@@ -0,0 +1 @@\n+x = 1\n"}, {})


NEW = "diff --git a/shop/flags.py b/shop/flags.py\nnew file mode 100644\n--- /dev/null\n"
NEW += "+++ b/shop/flags.py\n@@ -0,0 +1 @@\n+READY = True\n"


def test_a_new_module_is_off_the_path_unless_a_line_that_ran_names_it() -> None:
    ran = {"shop/cart.py": {1, 2, 3}}

    assert off_path({"shop/flags.py": NEW}, ran, named=set())
    assert off_path({"shop/flags.py": NEW}, ran, named={"cart", "flag"})
    assert not off_path({"shop/flags.py": NEW}, ran, named={"flags"})
    assert not off_path({"shop/flags.py": NEW}, ran, named=None)  # not measured: not judged
    # beside a change on the path, a new module does not make it off the path
    assert not off_path({"shop/flags.py": NEW, "shop/cart.py": CHANGE}, {"shop/cart.py": {11}},
                        named=set())  # fmt: skip
    # a renamed file (no lines, not created) is never judged
    renamed = "diff --git a/shop/a.py b/shop/b.py\nsimilarity index 100%\n"
    assert not off_path({"shop/b.py": renamed}, ran, named=set())


@pytest.mark.parametrize(
    ("path", "name"),
    [("shop/flags.py", "flags"), ("shop/flags/__init__.py", "flags"), ("setup.py", "setup"),
     ("__init__.py", "__init__")],
)  # fmt: skip
def test_a_new_file_is_named_by_its_module(path: str, name: str) -> None:
    assert module_name(path) == name


def test_the_tracer_records_the_lines_a_python_process_runs_under_the_root(
    tmp_path: Path,
) -> None:
    root = tmp_path / "workspace"
    (root / TRACE_DIR).mkdir(parents=True)
    (root / TRACE_DIR / "sitecustomize.py").write_text(TRACER)
    (root / "shop").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "cart.py").write_text(
        "def used():\n    return 1\n\n\ndef unused():\n    return 2\n"
    )
    program = "import shop.cart\nshop.cart.used()\n"
    argv, env = traced([sys.executable, "-c", program], str(root))

    done = subprocess.run(argv, cwd=root, env={**os.environ, **env}, capture_output=True)

    assert done.returncode == 0, done.stderr
    ran = executed((root / RECORD).read_text(), str(root), tests=["shop/cart.py"])
    assert ran is not None
    assert ran["shop/cart.py"] == {1, 2, 5}  # the defs at import, `used`'s body; not `unused`'s
    assert not any(path.startswith(TRACE_DIR) for path in ran)


def test_when_a_coverage_tool_takes_the_line_tracer_the_functions_called_stand_in(
    tmp_path: Path,
) -> None:
    root = tmp_path / "workspace"
    (root / TRACE_DIR).mkdir(parents=True)
    (root / TRACE_DIR / "sitecustomize.py").write_text(TRACER)
    (root / "cart.py").write_text("def used():\n    return 1\n\n\ndef unused():\n    return 2\n")
    (root / "test_cart.py").write_text("import cart\n\ncart.used()\n")
    # what coverage.py does: its own trace function in the one slot there is
    program = "import sys\nsys.settrace(lambda *a: None)\nimport test_cart\n"
    argv, env = traced([sys.executable, "-c", program], str(root))

    subprocess.run(argv, cwd=root, env={**os.environ, **env}, check=True)

    record = (root / RECORD).read_text()
    ran = executed(record, str(root), tests=["test_cart.py"])
    assert ran is not None and ran["cart.py"] == {1, 2, 5}  # module and `used`, every line
    assert executed(record, str(root), tests=["test_other.py"]) is None  # never shown to run


def test_a_missing_or_possibly_cut_record_says_nothing() -> None:
    assert executed("", "/workspace") is None
    assert executed("L\t/workspace/a.py\t1\n" * 200_000, "/workspace") is None
    assert executed("L\t/elsewhere/a.py\t1\n", "/workspace") == {}
    assert executed("L\t/workspace/a.py\t1\n", "/workspace", tests=["t.py"]) is None


SEQ = """def first(xs):
    try:
        return xs[0]
    except IndexError:
        raise ValueError("empty") from None


def quiet(xs):
    try:
        return first(xs)
    except ValueError:
        return None


def loud(xs):
    return first(xs)
"""
SEQ_TEST = """import contextlib

from shop.seq import first, loud, quiet


def test_it():
    assert quiet([]) is None  # caught inside the package: let out of first, not to the test
    with contextlib.suppress(ValueError):
        loud([])
    assert first([1]) == 1


test_it()
"""


def test_the_tracer_records_the_exceptions_functions_let_out_and_to_whom(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    (root / TRACE_DIR).mkdir(parents=True)
    (root / TRACE_DIR / "sitecustomize.py").write_text(TRACER)
    (root / "shop").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "seq.py").write_text(SEQ)
    (root / "test_seq.py").write_text(SEQ_TEST)
    argv, env = traced([sys.executable, "-c", "import test_seq"], str(root))

    done = subprocess.run(argv, cwd=root, env={**os.environ, **env}, capture_output=True)

    assert done.returncode == 0, done.stderr
    found = raised((root / RECORD).read_text(), str(root))
    # IndexError is caught where it was raised; ValueError leaves `first` twice (to `quiet`,
    # which keeps it, and to `loud`) and `loud` once, to the test; `<module>` frames are left out
    kinds = ("ValueError", "Exception", "BaseException")
    assert found == [  # each with the line of the call it arrived at
        Raised("ValueError", "shop/seq.py", "first", "shop/seq.py", kinds, 10),
        Raised("ValueError", "shop/seq.py", "first", "shop/seq.py", kinds, 16),
        Raised("ValueError", "shop/seq.py", "loud", "test_seq.py", kinds, 9),
    ]
    assert found[2].describe() == "ValueError out of loud (shop/seq.py)"
    assert found[2].is_a("ValueError") and found[2].is_a("builtins.Exception")
    assert not found[2].is_a("IndexError")


def test_exceptions_are_read_only_from_whole_rows_under_the_root() -> None:
    record = (
        "X\tKeyError\t/w/a.py\tget\t/usr/lib/python3/unittest/case.py\t58\n"
        "X\tKeyError\t/elsewhere/b.py\tget\t/w/t.py\t3\n"  # not under the root
        "X\tbroken\t/w/a.py\n"  # cut short
        "L\t/w/a.py\t1,2\n"
    )

    assert raised(record, "/w") == [Raised("KeyError", "a.py", "get", None, ("KeyError",), 58)]
    subclass = "X\tParseError,ValueError,Exception,BaseException\t/w/a.py\tload\t/w/t.py\t7\n"
    (found,) = raised(subclass, "/w")
    assert (found.error, found.caller, found.line) == ("ParseError", "t.py", 7)
    assert found.is_a("ParseError") and found.is_a("ValueError") and not found.is_a("KeyError")
    assert raised("X\tE\t/w/a.py\tf\t\t1\n" + "L\t/w/a.py\t1\n" * 200_000, "/w") == []  # cut
