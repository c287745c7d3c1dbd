"""The code tools and the local workspace, on real git working copies made by the repo cache."""

from __future__ import annotations

import pickle
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.adk.tools import FunctionTool

from testkit.sinks import MemoryArtifacts
from testkit.workspace import LocalWorkspace
from tests.repos import Git, Upstream
from workers.mirrors import RepoCache
from workers.tools.code import TOOL_NAMES, build_tools
from workers.tools.errors import ToolError

CART = "def total(prices):\n    return sum(prices)\n\n\ndef count(items):\n    return len(items)\n"
TEST_CART = (
    "from shopcart.cart import total\n\n\ndef test_total():\n    assert total([1, 2]) == 3\n"
)
FILES = {
    "README.md": "# shop\n",
    "shopcart/__init__.py": "",
    "shopcart/cart.py": CART,
    "tests/test_cart.py": TEST_CART,
}
BRANCH = "baton/run-1"
PYTHON = shlex.quote(sys.executable)


@dataclass
class Checkout:
    """A working copy of a fresh repository, with the tools of one stage over it."""

    origin: Path
    base: str
    ws: LocalWorkspace
    artifacts: MemoryArtifacts
    tools: dict[str, Callable[..., dict[str, Any]]]
    published: list[tuple[str, str, str]]
    """What the `publish` tool handed to the publisher: (title, body, diff)."""

    @property
    def path(self) -> Path:
        return self.ws.path


@dataclass(frozen=True)
class Template:
    """A working copy of FILES made once for the module; each test works on a copy of it."""

    origin: Path
    base: str
    path: Path


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Template:
    """A bare `origin` holding FILES and a working copy of it via `RepoCache.checkout` (whose
    objects live in the module's mirror, which stays until the module ends)."""
    base_dir = tmp_path_factory.mktemp("tools")
    upstream = Upstream(git, base_dir / "upstream")
    origin, base = upstream.bare, upstream.commit(FILES, "shop")
    path = RepoCache(base_dir / "cache").checkout(str(origin), base, base_dir / "template")
    return Template(origin, base, path)


@pytest.fixture
def make_checkout(tmp_path: Path, template: Template) -> Callable[..., Checkout]:
    """Makes working copies of FILES, each a copy of the module's template (git's own copy of
    a working tree, without a clone per test)."""
    made: list[Checkout] = []

    def make(*, test_timeout_s: float = 30, max_output_bytes: int = 64_000) -> Checkout:
        path = tmp_path / f"copy-{len(made)}"
        shutil.copytree(template.path, path, symlinks=True)
        origin, base = template.origin, template.base
        ws = LocalWorkspace(path, max_output_bytes=max_output_bytes)
        artifacts = MemoryArtifacts("run-1")
        published: list[tuple[str, str, str]] = []

        def publish(title: str, body: str, diff: str) -> dict[str, Any]:
            published.append((title, body, diff))
            return {"branch": BRANCH, "commit": "c0ffee", "pushed": True}

        tools = build_tools(
            TOOL_NAMES, ws, artifacts, test_timeout_s=test_timeout_s, publish=publish
        )
        made.append(
            Checkout(origin, base, ws, artifacts, {t.__name__: t for t in tools}, published)
        )
        return made[-1]

    return make


@pytest.fixture
def checkout(make_checkout: Callable[..., Checkout]) -> Checkout:
    return make_checkout()


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique word for command lines; no process carrying it may outlive the test."""
    word = f"baton-test-{uuid.uuid4().hex}"
    yield word
    subprocess.run(["pkill", "-KILL", "-f", word], check=False)


def processes_with(word: str) -> list[str]:
    found = subprocess.run(["pgrep", "-a", "-f", word], capture_output=True, text=True)
    return found.stdout.splitlines()


# -- building the tools -----------------------------------------------------------------------


def test_build_tools_returns_the_named_tools_in_order(checkout: Checkout) -> None:
    tools = build_tools(["read_file", "search_code"], checkout.ws, checkout.artifacts)

    assert [tool.__name__ for tool in tools] == ["read_file", "search_code"]


def test_build_tools_refuses_an_unknown_name_and_lists_the_known_ones(checkout: Checkout) -> None:
    with pytest.raises(ValueError) as caught:
        build_tools(["read_file", "rm_rf"], checkout.ws, checkout.artifacts)

    assert "rm_rf" in str(caught.value)
    assert "read_file" in str(caught.value) and "publish" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "parameters", "required"),
    [
        ("list_files", {"path", "glob"}, set()),
        ("search_code", {"pattern", "path", "glob"}, {"pattern"}),
        ("read_file", {"path", "start_line", "end_line"}, {"path"}),
        ("edit_file", {"path", "old_text", "new_text"}, {"path", "old_text", "new_text"}),
        ("apply_patch", {"patch"}, {"patch"}),
        ("run_tests", {"command"}, {"command"}),
        ("show_diff", set(), set()),
        ("publish", {"title", "body"}, {"title", "body"}),
    ],
)
def test_adk_declares_each_tool_with_its_arguments_and_docstring(
    checkout: Checkout, name: str, parameters: set[str], required: set[str]
) -> None:
    declaration = FunctionTool(checkout.tools[name])._get_declaration()

    assert declaration is not None
    assert declaration.name == name
    assert declaration.description
    schema = declaration.parameters_json_schema or {}
    assert set(schema.get("properties", {})) == parameters
    assert set(schema.get("required", [])) == required


def test_tool_error_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(ToolError("no file 'x'")))

    assert isinstance(error, ToolError)
    assert str(error) == "no file 'x'"


def test_memory_artifacts_keep_the_bytes_under_a_run_uri() -> None:
    artifacts = MemoryArtifacts("run-7")

    uri = artifacts.save("test-log-1.txt", b"3 passed\n")

    assert uri == "artifact://run-7/test-log-1.txt"
    assert artifacts.data["test-log-1.txt"] == b"3 passed\n"
    assert artifacts.refs["test-log-1.txt"].size_bytes == 9


# -- paths stay inside the working copy -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("../x", "'..'"),
        ("shopcart/../../x", "'..'"),
        ("/etc/passwd", "not a relative path"),
        ("~/.ssh/id_rsa", "not a relative path"),
        ("outside/secret.txt", "outside the repository"),
        (".git/config", "inside .git"),
    ],
)
def test_paths_leading_out_of_the_working_copy_are_refused(
    checkout: Checkout, tmp_path: Path, path: str, words: str
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "secret.txt").write_text("s3cret\n")
    (checkout.path / "outside").symlink_to(secrets)

    read = checkout.tools["read_file"](path)
    created = checkout.tools["edit_file"](path, "", "overwritten\n")

    assert words in read["error"]
    assert words in created["error"]
    assert (secrets / "secret.txt").read_text() == "s3cret\n"


def test_a_symlink_that_stays_inside_the_working_copy_can_be_read(checkout: Checkout) -> None:
    (checkout.path / "cart-link.py").symlink_to("shopcart/cart.py")

    assert checkout.tools["read_file"]("cart-link.py")["total_lines"] == 6


# -- listing, searching and reading -----------------------------------------------------------


def test_list_files_shows_tracked_and_new_files_but_not_ignored_ones(checkout: Checkout) -> None:
    (checkout.path / ".gitignore").write_text("*.log\n")
    (checkout.path / "debug.log").write_text("noise\n")
    (checkout.path / "shopcart" / "tax.py").write_text("RATE = 0.2\n")

    listed = checkout.tools["list_files"]()

    assert listed == {
        "files": [
            ".gitignore",
            "README.md",
            "shopcart/__init__.py",
            "shopcart/cart.py",
            "shopcart/tax.py",
            "tests/test_cart.py",
        ],
        "count": 6,
    }


def test_list_files_leaves_out_a_tracked_file_deleted_from_the_working_tree(
    checkout: Checkout,
) -> None:
    (checkout.path / "README.md").unlink()

    listed = checkout.tools["list_files"]()["files"]

    assert "README.md" not in listed
    assert "shopcart/cart.py" in listed


@pytest.mark.parametrize(
    ("path", "glob", "files"),
    [
        ("shopcart", "", ["shopcart/__init__.py", "shopcart/cart.py"]),
        (".", "*.py", ["shopcart/__init__.py", "shopcart/cart.py", "tests/test_cart.py"]),
        (".", "tests/*.py", ["tests/test_cart.py"]),
        ("shopcart", "cart.py", ["shopcart/cart.py"]),
    ],
)
def test_list_files_narrows_by_path_and_glob(
    checkout: Checkout, path: str, glob: str, files: list[str]
) -> None:
    assert checkout.tools["list_files"](path, glob)["files"] == files


def test_list_files_of_a_missing_directory_is_an_error(checkout: Checkout) -> None:
    assert "no file or directory 'nowhere'" in checkout.tools["list_files"]("nowhere")["error"]


@pytest.fixture(params=["ripgrep", "git grep"])
def search_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with ripgrep, then as on a machine without it (the git grep fallback)."""
    if request.param == "git grep":
        monkeypatch.setattr("testkit.workspace.shutil.which", lambda *_, **__: None)
    return str(request.param)


def test_search_code_gives_path_line_and_text(checkout: Checkout, search_engine: str) -> None:
    (checkout.path / "shopcart" / "tax.py").write_text("def total_tax(prices):\n    pass\n")

    found = checkout.tools["search_code"](r"def total\w*")

    assert found == {
        "matches": [
            "shopcart/cart.py:1:def total(prices):",
            "shopcart/tax.py:1:def total_tax(prices):",
        ],
        "count": 2,
    }


@pytest.mark.parametrize(
    ("path", "glob", "matches"),
    [
        ("tests", "", ["tests/test_cart.py:5:    assert total([1, 2]) == 3"]),
        (".", "cart.py", ["shopcart/cart.py:2:    return sum(prices)"]),
    ],
)
def test_search_code_narrows_by_path_and_glob(
    checkout: Checkout, search_engine: str, path: str, glob: str, matches: list[str]
) -> None:
    pattern = "total\\(\\[|return sum"

    assert checkout.tools["search_code"](pattern, path, glob)["matches"] == matches


def test_search_code_caps_the_matches_and_says_how_many_were_left_out(
    checkout: Checkout, search_engine: str
) -> None:
    (checkout.path / "many.txt").write_text("needle\n" * 120)

    found = checkout.tools["search_code"]("needle")

    assert len(found["matches"]) == 50
    assert found["matches"][0] == "many.txt:1:needle"
    assert found["count"] == 120
    assert found["omitted"] == 70
    assert "70 more matches not shown" in found["note"]


def test_search_code_without_a_match_is_empty(checkout: Checkout, search_engine: str) -> None:
    assert checkout.tools["search_code"]("no_such_identifier") == {"matches": [], "count": 0}


def test_search_code_with_a_broken_regex_says_so(checkout: Checkout) -> None:
    assert "search failed" in checkout.tools["search_code"]("def (")["error"]


def test_read_file_numbers_the_lines_of_a_range(checkout: Checkout) -> None:
    read = checkout.tools["read_file"]("shopcart/cart.py", 1, 2)

    assert read == {
        "path": "shopcart/cart.py",
        "start_line": 1,
        "end_line": 2,
        "total_lines": 6,
        "content": "   1| def total(prices):\n   2|     return sum(prices)",
    }


def test_read_file_to_the_end_with_end_line_zero(checkout: Checkout) -> None:
    read = checkout.tools["read_file"]("shopcart/cart.py", 5)

    assert read["content"] == "   5| def count(items):\n   6|     return len(items)"
    assert read["end_line"] == 6


def test_read_file_shows_at_most_400_lines_and_says_where_to_go_on(checkout: Checkout) -> None:
    (checkout.path / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 1001)))

    read = checkout.tools["read_file"]("long.txt", 101)

    assert read["start_line"] == 101 and read["end_line"] == 500
    assert read["content"].splitlines()[-1] == " 500| line 500"
    assert read["content"].count("\n") == 399
    assert "continue at 501" in read["note"]


@pytest.mark.parametrize(
    ("path", "start", "end", "words"),
    [
        ("shopcart/cart.py", 7, 0, "past the end: shopcart/cart.py has 6 lines"),
        ("shopcart/cart.py", 3, 2, "start_line <= end_line"),
        ("shopcart/cart.py", 0, 0, "start_line <= end_line"),
        ("shopcart/nope.py", 1, 0, "no file 'shopcart/nope.py'"),
        ("shopcart", 1, 0, "no file 'shopcart'"),
    ],
)
def test_read_file_errors_say_what_to_fix(
    checkout: Checkout, path: str, start: int, end: int, words: str
) -> None:
    assert words in checkout.tools["read_file"](path, start, end)["error"]


# -- changing files ---------------------------------------------------------------------------


def test_edit_file_replaces_exactly_one_occurrence(checkout: Checkout) -> None:
    edited = checkout.tools["edit_file"](
        "shopcart/cart.py", "    return sum(prices)\n", "    return round(sum(prices), 2)\n"
    )

    assert edited == {"path": "shopcart/cart.py", "replaced_at_line": 2}
    assert (checkout.path / "shopcart/cart.py").read_text() == CART.replace(
        "return sum(prices)", "return round(sum(prices), 2)"
    )


@pytest.mark.parametrize(
    ("old_text", "words"),
    [
        ("return max(prices)", "old_text was not found in shopcart/cart.py"),
        ("    return ", "old_text occurs 2 times in shopcart/cart.py"),
    ],
)
def test_edit_file_changes_nothing_unless_old_text_occurs_once(
    checkout: Checkout, old_text: str, words: str
) -> None:
    edited = checkout.tools["edit_file"]("shopcart/cart.py", old_text, "    return 0")

    assert words in edited["error"]
    assert (checkout.path / "shopcart/cart.py").read_text() == CART


def test_edit_file_keeps_crlf_line_ends(checkout: Checkout) -> None:
    (checkout.path / "win.txt").write_bytes(b"a = 1\r\nb = 2\r\n")

    checkout.tools["edit_file"]("win.txt", "a = 1\nb = 2", "a = 10\nb = 20")

    assert (checkout.path / "win.txt").read_bytes() == b"a = 10\r\nb = 20\r\n"


def test_edit_file_with_empty_old_text_creates_a_new_file(checkout: Checkout) -> None:
    created = checkout.tools["edit_file"]("shopcart/tax/rates.py", "", "RATE = 0.2\n")

    assert created == {"path": "shopcart/tax/rates.py", "created": True}
    assert (checkout.path / "shopcart/tax/rates.py").read_text() == "RATE = 0.2\n"


def test_edit_file_with_empty_old_text_never_overwrites(checkout: Checkout) -> None:
    edited = checkout.tools["edit_file"]("shopcart/cart.py", "", "gone\n")

    assert "shopcart/cart.py exists" in edited["error"]
    assert (checkout.path / "shopcart/cart.py").read_text() == CART


PATCH = """\
--- a/shopcart/cart.py
+++ b/shopcart/cart.py
@@ -1,2 +1,2 @@
 def total(prices):
-    return sum(prices)
+    return sum(prices or [])
"""


def test_apply_patch_applies_a_diff_with_context_on_one_side_only(checkout: Checkout) -> None:
    assert checkout.tools["apply_patch"](PATCH) == {"applied": True}
    assert (checkout.path / "shopcart/cart.py").read_text() == CART.replace(
        "sum(prices)", "sum(prices or [])"
    )


def test_apply_patch_that_does_not_fit_changes_nothing_and_quotes_git(checkout: Checkout) -> None:
    checkout.tools["edit_file"]("shopcart/cart.py", "return sum(prices)", "return 0")

    applied = checkout.tools["apply_patch"](PATCH)

    assert "the patch does not apply" in applied["error"]
    assert "patch failed: shopcart/cart.py:1" in applied["error"]
    assert "return sum(prices or [])" not in (checkout.path / "shopcart/cart.py").read_text()


def test_apply_patch_refuses_paths_outside_the_working_copy(
    checkout: Checkout, tmp_path: Path
) -> None:
    escaping = "--- /dev/null\n+++ b/../escaped.txt\n@@ -0,0 +1 @@\n+hi\n"

    assert "error" in checkout.tools["apply_patch"](escaping)
    assert not (tmp_path / "escaped.txt").exists()


# -- running tests ----------------------------------------------------------------------------


def test_run_tests_reports_a_passing_run_and_saves_its_log(checkout: Checkout) -> None:
    ran = checkout.tools["run_tests"](f"{PYTHON} -m pytest -q tests/test_cart.py")

    assert ran["passed"] is True
    assert ran["exit_code"] == 0
    assert ran["timed_out"] is False
    assert "1 passed" in ran["output_tail"]
    assert ran["log"] == "artifact://run-1/test-log-1.txt"
    assert "1 passed" in checkout.artifacts.data["test-log-1.txt"].decode()
    assert checkout.tools["show_diff"]()["diff"] == "", "running tests left files behind"


def test_run_tests_reports_a_failing_run_with_its_exit_code(checkout: Checkout) -> None:
    checkout.tools["run_tests"](f"{PYTHON} -c 'print(1)'")

    ran = checkout.tools["run_tests"](f"{PYTHON} -c 'import sys; print(\"boom\"); sys.exit(3)'")

    assert ran["passed"] is False
    assert ran["exit_code"] == 3
    assert ran["output_tail"] == "boom\n"
    assert ran["log"] == "artifact://run-1/test-log-2.txt"


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("", "give one command"),
        ("pytest && rm -rf /", "give one command"),
        ("pytest 'unclosed", "cannot parse the command"),
        ("no-such-program-xyz --help", "cannot run 'no-such-program-xyz'"),
    ],
)
def test_run_tests_refuses_what_it_cannot_run(checkout: Checkout, command: str, words: str) -> None:
    assert words in checkout.tools["run_tests"](command)["error"]


def test_run_tests_kills_a_hanging_command_and_its_children_at_the_timeout(
    make_checkout: Callable[..., Checkout], marker: str
) -> None:
    checkout = make_checkout(test_timeout_s=1)
    child = f"import time; time.sleep(100)  # {marker}"
    parent = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
        f"time.sleep(100)  # {marker}"
    )

    started = time.monotonic()
    ran = checkout.tools["run_tests"](f"{PYTHON} -c {shlex.quote(parent)}")

    assert time.monotonic() - started < 10
    assert ran["timed_out"] is True
    assert ran["passed"] is False
    assert ran["exit_code"] == -9
    assert processes_with(marker) == []


def test_a_command_that_leaves_a_background_child_returns_when_it_exits(
    checkout: Checkout, marker: str
) -> None:
    child = f"import time; time.sleep(100)  # {marker}"
    parent = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"

    started = time.monotonic()
    result = checkout.ws.run([sys.executable, "-c", parent], timeout_s=30)

    assert time.monotonic() - started < 10
    assert result.exit_code == 0
    assert result.timed_out is False
    assert processes_with(marker) == []


def test_a_flood_of_output_is_capped_to_its_head_and_tail(
    make_checkout: Callable[..., Checkout],
) -> None:
    checkout = make_checkout(max_output_bytes=10_000)
    flood = "import sys; sys.stdout.write('START' + 'x' * 5_000_000 + 'END')"

    result = checkout.ws.run([sys.executable, "-c", flood], timeout_s=30)
    ran = checkout.tools["run_tests"](f"{PYTHON} -c {shlex.quote(flood)}")

    assert result.exit_code == 0 and result.truncated is True
    assert result.output.startswith("START") and result.output.endswith("END")
    assert len(result.output) < 10_200
    assert "bytes of output omitted" in result.output
    assert len(ran["output_tail"]) == 3_000


def test_an_endless_flood_is_capped_and_killed(make_checkout: Callable[..., Checkout]) -> None:
    checkout = make_checkout(max_output_bytes=10_000)
    endless = "while True: print('y' * 1000)"

    result = checkout.ws.run([sys.executable, "-c", endless], timeout_s=1)

    assert result.timed_out is True and result.truncated is True
    assert len(result.output) < 10_200


def test_commands_never_see_this_process_environment(
    checkout: Checkout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_TEST_CANARY", "canary-value-7f3a")
    monkeypatch.setenv("GOOGLE_API_KEY", "not-a-real-key-91c2")
    show_env = "import os; print(sorted(os.environ.items()))"

    ran = checkout.tools["run_tests"](f"{PYTHON} -c {shlex.quote(show_env)}")

    assert ran["passed"] is True
    assert "canary-value-7f3a" not in ran["output_tail"]
    assert "BATON_TEST_CANARY" not in ran["output_tail"]
    assert "GOOGLE_API_KEY" not in ran["output_tail"]
    assert f"('HOME', '{Path.home()}')" not in ran["output_tail"]


def test_python_on_the_command_path_is_the_workers_own(checkout: Checkout) -> None:
    ran = checkout.tools["run_tests"]("python -c 'import sys; print(sys.executable)'")

    assert Path(ran["output_tail"].strip()).parent == Path(sys.executable).parent


# -- the diff and publishing ------------------------------------------------------------------


def test_show_diff_of_an_untouched_working_copy_says_there_is_nothing(checkout: Checkout) -> None:
    shown = checkout.tools["show_diff"]()

    assert shown["diff"] == "" and shown["files"] == []
    assert "no changes" in shown["note"]
    assert checkout.artifacts.data == {}


def test_show_diff_includes_new_files_and_saves_the_diff(checkout: Checkout) -> None:
    checkout.tools["edit_file"]("shopcart/cart.py", "sum(prices)", "sum(prices or [])")
    checkout.tools["edit_file"]("shopcart/tax.py", "", "RATE = 0.2\n")

    shown = checkout.tools["show_diff"]()

    assert shown["files"] == ["shopcart/cart.py", "shopcart/tax.py"]
    assert "-    return sum(prices)\n+    return sum(prices or [])\n" in shown["diff"]
    assert "+++ b/shopcart/tax.py\n@@ -0,0 +1 @@\n+RATE = 0.2\n" in shown["diff"]
    assert shown["artifact"] == "artifact://run-1/workspace.diff"
    assert checkout.artifacts.data["workspace.diff"].decode() == shown["diff"]


def test_show_diff_caps_a_big_diff_and_keeps_all_of_it_in_the_artifact(checkout: Checkout) -> None:
    checkout.tools["edit_file"]("big.txt", "", "".join(f"row {n}\n" for n in range(5_000)))

    shown = checkout.tools["show_diff"]()

    saved = checkout.artifacts.data["workspace.diff"].decode()
    assert "+row 4999\n" in saved
    assert shown["chars"] == len(saved)
    assert len(shown["diff"]) < 6_200
    assert "chars cut; the full diff: artifact://run-1/workspace.diff" in shown["diff"]


def test_a_diff_applies_to_a_fresh_working_copy(make_checkout: Callable[..., Checkout]) -> None:
    first, second = make_checkout(), make_checkout()
    first.tools["edit_file"]("shopcart/cart.py", "sum(prices)", "sum(prices or [])")
    first.tools["edit_file"]("docs/notes.md", "", "new\n")

    second.ws.apply_patch(first.ws.diff())

    assert second.ws.diff() == first.ws.diff()


def test_publish_hands_title_body_and_the_whole_diff_to_the_publisher(checkout: Checkout) -> None:
    checkout.tools["edit_file"]("shopcart/cart.py", "sum(prices)", "sum(prices or [])")

    published = checkout.tools["publish"](" Fix total of no prices ", "total(None) raised.\n")

    assert published == {"branch": BRANCH, "commit": "c0ffee", "pushed": True}
    [(title, body, diff)] = checkout.published
    assert (title, body) == ("Fix total of no prices", "total(None) raised.")
    assert diff == checkout.ws.diff()
    assert "+    return sum(prices or [])\n" in diff


def test_publish_is_refused_to_a_stage_without_a_publisher(checkout: Checkout) -> None:
    checkout.tools["edit_file"]("shopcart/cart.py", "sum(prices)", "sum(prices or [])")
    [publish] = build_tools(["publish"], checkout.ws, checkout.artifacts)

    assert publish("Fix total", "Body.") == {"error": "publishing is not available to this stage"}


def test_publish_without_changes_refuses_and_pushes_nothing(checkout: Checkout) -> None:
    published = checkout.tools["publish"]("Fix total", "Body.")

    assert "nothing to publish" in published["error"]
    assert checkout.published == []


def test_publish_needs_a_one_line_title(checkout: Checkout) -> None:
    checkout.tools["edit_file"]("shopcart/cart.py", "sum(prices)", "sum(prices or [])")

    assert "one non-empty line" in checkout.tools["publish"]("Fix\ntotal", "Body.")["error"]
    assert "one non-empty line" in checkout.tools["publish"]("  ", "Body.")["error"]
    assert checkout.published == []
