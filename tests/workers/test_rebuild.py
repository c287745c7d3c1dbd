"""Build products and the build step, against real git and a real shell in a folder: which
products git ignores, what the image keeps, when the step runs, and what a failing one says."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from sandbox.build import MAX_PRODUCTS, EnvironmentBuildError, _checked_products
from sandbox.products import keep_products
from tests.repos import Git, Upstream
from workers.mirrors import UNCHANGED_MTIME, RepoCache
from workers.rebuild import BuildRun, Rebuild, collisions, excluded, ignore_pattern
from workers.tools.errors import ToolError
from workers.tools.workspace import CommandResult


def _runner(root: Path) -> Callable[[Sequence[str], float], CommandResult]:
    def run(argv: Sequence[str], timeout_s: float) -> CommandResult:
        done = subprocess.run(
            list(argv), cwd=root, capture_output=True, timeout=timeout_s, check=False
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
        return CommandResult(done.returncode, output, timed_out=False, truncated=False)

    return run


def _exclude_into(root: Path) -> Callable[..., None]:
    def exclude(paths: object) -> None:
        lines = "".join(f"{ignore_pattern(p)}\n" for p in paths)  # type: ignore[attr-defined]
        with (root / ".git/info/exclude").open("a") as file:
            file.write(lines)

    return exclude


@pytest.fixture
def project(tmp_path: Path, git: Git) -> Path:
    """A repository whose "build" copies `src.txt` into the untracked `product.out`, built
    once (as an environment image's setup would have), with that product ignored."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "src.txt").write_text("one\n")
    (root / "README").write_text("docs\n")
    (root / "product.out").write_text("one\n")
    git("init", "-q", cwd=root)
    (root / ".git/info/exclude").write_text(ignore_pattern("product.out") + "\n")
    git("add", "--all", cwd=root)
    git("commit", "-q", "-m", "baseline", cwd=root)
    return root


def test_an_unchanged_tree_is_not_built_and_a_changed_input_is_built_once(
    project: Path,
) -> None:
    builds: list[BuildRun] = []
    rebuild = Rebuild(["cp src.txt product.out"], ["*.txt"], stale=False, on_build=builds.append)
    run, exclude = _runner(project), _exclude_into(project)

    assert rebuild.ensure(run, exclude) is None
    (project / "README").write_text("not an input\n")
    assert rebuild.ensure(run, exclude) is None
    (project / "src.txt").write_text("two\n")
    ran = rebuild.ensure(run, exclude)

    assert ran is not None and ran.failed_command is None and ran.exit_code == 0
    assert (project / "product.out").read_text() == "two\n"
    assert rebuild.ensure(run, exclude) is None, "built again with nothing changed"
    assert [b.commands for b in builds] == [("cp src.txt product.out",)]


def test_a_stale_image_is_built_before_the_first_command(project: Path) -> None:
    (project / "product.out").write_text("built from another commit\n")
    rebuild = Rebuild(["cp src.txt product.out"], ["*.txt"], stale=True)

    assert rebuild.ensure(_runner(project), _exclude_into(project)) is not None
    assert (project / "product.out").read_text() == "one\n"


def test_what_a_build_makes_never_enters_the_change_but_a_new_file_of_the_model_does(
    project: Path, git: Git
) -> None:
    (project / "test_new.txt").write_text("the model's new test\n")
    rebuild = Rebuild(["mkdir -p out/obj && echo x > out/obj/a.o && echo y > gen.h"], stale=True)

    rebuild.ensure(_runner(project), _exclude_into(project))
    git("add", "--intent-to-add", "--all", cwd=project)
    changed = git("diff", "HEAD", "--name-only", cwd=project).split()

    assert changed == ["test_new.txt"]


def test_a_failing_build_is_a_tool_error_with_its_status_and_tail_and_is_tried_again(
    project: Path,
) -> None:
    builds: list[BuildRun] = []
    command = "echo compiling; echo 'error: expected ;' >&2; exit 3"
    rebuild = Rebuild(["true", command], stale=True, on_build=builds.append)
    run, exclude = _runner(project), _exclude_into(project)

    with pytest.raises(ToolError) as raised:
        rebuild.ensure(run, exclude)
    message = raised.value.message
    assert f"`{command}` exited with 3" in message
    assert message.rstrip().endswith("error: expected ;")
    assert builds[0].failed_command == command and builds[0].exit_code == 3
    with pytest.raises(ToolError):
        rebuild.ensure(run, exclude)
    assert len(builds) == 2, "a failed build must be tried again, not taken as built"


@pytest.mark.parametrize(
    "name",
    ["a*b.so", "[x].c", "q?.h", "back\\slash.o", "#hash", "!bang", "trailing  ", "sp ace/"],
)
def test_an_ignore_pattern_matches_exactly_its_path_and_not_a_neighbour(
    tmp_path: Path, git: Git, name: str
) -> None:
    root = tmp_path / "r"
    root.mkdir()
    git("init", "-q", cwd=root)
    bare = name.rstrip("/")
    neighbour = "a-b.so" if name == "a*b.so" else "x.c" if name == "[x].c" else bare + "x"
    for path in (bare, neighbour):
        if name.endswith("/"):
            (root / path).mkdir()
            (root / path / "f").write_text("")
        else:
            (root / path).write_text("")
    (root / ".git/info/exclude").write_text(ignore_pattern(name) + "\n")

    untracked = git("ls-files", "--others", "--exclude-standard", "-z", cwd=root)
    shown = {p.split("/")[0] for p in untracked.split("\0") if p}

    assert bare not in shown
    assert neighbour in shown


def test_products_the_commit_tracks_are_its_files_and_tracked_files_in_a_product_folder_stay() -> (
    None
):
    products = ["build/", "node_modules", "pkg/_speedups.so", "pkg/version.py"]
    tracked = ["build/keep.txt", "build/sub/x.py", "buildx/y", "pkg/__init__.py", "pkg/version.py"]

    patterns, forced = excluded(products, tracked)

    assert patterns == ["/build/", "/node_modules", "/pkg/_speedups.so"]
    assert forced == ["build/keep.txt", "build/sub/x.py"]


def test_a_product_of_another_kind_than_the_tracked_path_is_in_the_way() -> None:
    products = ["docs/", "gen", "lib/", "pkg/x.so"]
    tracked = ["docs", "gen/a.txt", "lib/keep.c", "pkg/y.py"]

    assert collisions(products, tracked) == ["docs", "gen"]


def test_the_image_keeps_what_the_setup_made_and_drops_every_tracked_file(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    tracked = {"setup.py", "pkg/__init__.py", "pkg/_speedups.c", "docs/index.rst", "a/b/c.txt"}
    for name in tracked:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    made = ["pkg/_speedups.cpython-311-x86_64-linux-gnu.so", "build/temp/x.o", "pkg.egg-info/PKG"]
    for name in made:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("built")
    (root / "node_modules").symlink_to("/opt/baton/node_modules")

    products = keep_products(str(root), tracked)

    assert products == [
        "build/",
        "node_modules",
        "pkg/_speedups.cpython-311-x86_64-linux-gnu.so",
        "pkg.egg-info/",
    ]
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert left == [
        "build", "build/temp", "build/temp/x.o", "node_modules", "pkg",
        "pkg.egg-info", "pkg.egg-info/PKG", "pkg/_speedups.cpython-311-x86_64-linux-gnu.so",
    ]  # fmt: skip


def test_the_tree_laid_over_products_dates_only_the_changed_files_now(
    make_upstream: Callable[[], Upstream], tmp_path: Path
) -> None:
    upstream = make_upstream()
    built = upstream.commit({"pkg/a.c": "int a;\n", "pkg/b.c": "int b;\n", "old.txt": "x\n"})
    run = upstream.commit({"pkg/a.c": "int a = 1;\n", "new.txt": "y\n"})
    cache = RepoCache(tmp_path / "cache")
    before = int(time.time())

    tree = cache.archive(str(upstream.bare), run, uid=1000, gid=1000, over=built)
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        dated = {m.name: m.mtime for m in archive.getmembers() if m.isfile()}

    assert cache.changed(str(upstream.bare), built, run) == {"pkg/a.c", "new.txt"}
    assert cache.changed(str(upstream.bare), built, run, ["*.c"]) == {"pkg/a.c"}
    assert dated["pkg/b.c"] == UNCHANGED_MTIME
    assert dated["pkg/a.c"] >= before and dated["new.txt"] >= before
    assert cache.changed(str(upstream.bare), "0" * 40, run) is None
    everything = cache.archive(str(upstream.bare), run, uid=1000, gid=1000, over="0" * 40)
    with tarfile.open(fileobj=io.BytesIO(everything)) as archive:
        assert all(m.mtime >= before for m in archive.getmembers() if m.isfile())


@pytest.mark.parametrize(
    ("printed", "says"),
    [
        ({"build/": 1}, "not a list of paths"),
        (["build/", 3], "not a list of paths"),
        (["/etc/passwd"], "holds '/etc/passwd'"),
        (["pkg/../../etc"], "holds 'pkg/../../etc'"),
        ([""], "holds ''"),
        ([f"p{n}.so" for n in range(MAX_PRODUCTS + 1)], "more than 20000"),
    ],
)
def test_a_products_list_a_hostile_setup_printed_is_refused(printed: object, says: str) -> None:
    with pytest.raises(EnvironmentBuildError, match=re.escape(says)):
        _checked_products(printed)


def test_a_products_list_of_paths_inside_the_workspace_is_kept_as_it_is() -> None:
    printed = ["build/", "pkg/_x.cpython-311-x86_64-linux-gnu.so", "node_modules", "a b/c..d"]

    assert _checked_products(printed) == tuple(printed)
