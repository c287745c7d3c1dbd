"""SWE-bench records read as instances, without services: good records (lists as JSON text or
as lists, `.jsonl` or `.json`) become instance folders whose base is the record's commit and
whose environment is the detected one; a malformed record is refused naming the line and the
field, with nothing written; repositories are found in a folder or given by path or URL."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evaluation.cli import eval_command
from evaluation.corpus import CorpusError, GitSource, materialize
from evaluation.swebench import Repos, load_records, parse_repo_option, read_records
from tests.repos import Git

PYPROJECT = """[build-system]
requires = ["setuptools>=64", "setuptools-scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "calc"
dynamic = ["version"]

[project.optional-dependencies]
test = ["pytest"]
"""
CORE = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n"
FIXED = CORE.replace("len(values)\n", "len(values) if values else 0\n")
TEST = "from calc.core import mean\n\n\ndef test_mean():\n    assert mean([2, 4]) == 3\n"
ADDED = "\n\ndef test_mean_of_nothing():\n    assert mean([]) == 0\n"
STATEMENT = (
    "mean() of an empty list crashes\n\n>>> mean([])\nTraceback (most recent call last):\n"
    "ZeroDivisionError: division by zero\n"
)


@pytest.fixture
def upstream(tmp_path: Path, git: Git) -> dict[str, str]:
    """A repository `example/calc` at tmp_path/repos/example+calc (a work tree): its base
    commit, and the fix and its test as SWE-bench's `patch` and `test_patch`."""
    work = tmp_path / "repos" / "example+calc"
    (work / "calc").mkdir(parents=True)
    (work / "tests").mkdir()
    (work / "pyproject.toml").write_text(PYPROJECT)
    (work / "calc" / "__init__.py").write_text("")
    (work / "calc" / "core.py").write_text(CORE)
    (work / "tests" / "test_core.py").write_text(TEST)
    git("init", "-q", "--initial-branch=main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "base", cwd=work)
    base = git("rev-parse", "HEAD", cwd=work)
    (work / "calc" / "core.py").write_text(FIXED)
    (work / "tests" / "test_core.py").write_text(TEST + ADDED)
    patch = git("diff", "--", "calc", cwd=work) + "\n"
    test_patch = git("diff", "--", "tests", cwd=work) + "\n"
    git("commit", "-q", "-am", "fix", cwd=work)  # the base is no longer HEAD
    return {"base": base, "patch": patch, "test_patch": test_patch, "work": str(work)}


def record(upstream: dict[str, str], **change: Any) -> dict[str, Any]:
    fields = {
        "instance_id": "example__calc-12", "repo": "example/calc",
        "base_commit": upstream["base"], "patch": upstream["patch"],
        "test_patch": upstream["test_patch"], "problem_statement": STATEMENT,
        "FAIL_TO_PASS": json.dumps(["tests/test_core.py::test_mean_of_nothing"]),
        "PASS_TO_PASS": json.dumps(["tests/test_core.py::test_mean"]),
        "version": "1.4", "environment_setup_commit": upstream["base"], "hints_text": "",
        "created_at": "2026-01-02T03:04:05Z",
    }  # fmt: skip
    fields.update(change)
    return {k: v for k, v in fields.items() if v is not None}


def write_jsonl(path: Path, *records: dict[str, Any] | str) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_records_become_instances_with_the_base_tree_and_a_detected_environment(
    tmp_path: Path, upstream: dict[str, str], git: Git
) -> None:
    ids = ["tests/test_core.py::test_mean_of_nothing"]
    second = record(upstream, instance_id="example__calc-13", FAIL_TO_PASS=ids, PASS_TO_PASS=[])
    path = write_jsonl(tmp_path / "set.jsonl", record(upstream), "", second)

    work = tmp_path / "work"
    first, other = load_records(path, Repos(folder=tmp_path / "repos"), work)

    assert (first.id, other.id) == ("example__calc-12", "example__calc-13")
    assert first.source == GitSource(git="https://github.com/example/calc", commit=upstream["base"])
    assert first.tests.runner == "pytest"
    assert first.tests.fail_to_pass == ("tests/test_core.py::test_mean_of_nothing",)
    assert first.tests.pass_to_pass == ("tests/test_core.py::test_mean",)
    assert other.tests.fail_to_pass == first.tests.fail_to_pass and other.tests.pass_to_pass == ()
    assert first.title == "mean() of an empty list crashes"
    assert first.issue["body"] == (
        ">>> mean([])\nTraceback (most recent call last):\nZeroDivisionError: division by zero"
    )
    assert first.issue["number"] == 12
    assert first.issue["html_url"] == "https://github.com/example/calc/issues/12"
    assert first.text("gold.patch") == upstream["patch"]
    assert first.text("test.patch") == upstream["test_patch"]
    env = first.environment
    assert env["test"] == "python -m pytest"
    assert env["env"]["SETUPTOOLS_SCM_PRETEND_VERSION"] == "1.4"  # the record's version
    assert "python -m pip install -e '.[test]'" in env["setup"]  # the project's test extra
    with tarfile.open(first.folder / "base.tar.gz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
            "calc/__init__.py", "calc/core.py", "pyproject.toml", "tests/test_core.py",
        ]  # fmt: skip
        core = tar.extractfile("calc/core.py")
        assert core is not None and core.read().decode() == CORE  # the base, not HEAD

    checkout = materialize(first, work / "repos", work / "downloads")
    clone = tmp_path / "clone"
    git("clone", "-q", checkout.remote, clone)
    git("apply", first.folder / "test.patch", cwd=clone)
    git("apply", first.folder / "gold.patch", cwd=clone)
    assert (clone / "calc" / "core.py").read_text() == FIXED


def test_a_json_list_a_given_path_and_a_clone_url_are_read(
    tmp_path: Path, upstream: dict[str, str], git: Git
) -> None:
    bare = tmp_path / "elsewhere" / "calc.git"
    git("clone", "-q", "--bare", upstream["work"], bare)
    path = tmp_path / "set.json"
    path.write_text(json.dumps([record(upstream)]))

    by_path = load_records(path, Repos(given={"example/calc": str(bare)}), tmp_path / "a")
    by_url = load_records(path, Repos(given={"example/calc": f"file://{bare}"}), tmp_path / "b")
    in_folder = load_records(path, Repos(folder=tmp_path / "elsewhere"), tmp_path / "c")

    for loaded in (by_path, by_url, in_folder):
        assert [i.id for i in loaded] == ["example__calc-12"]
        assert loaded[0].source.commit == upstream["base"]  # type: ignore[union-attr]
    assert (tmp_path / "b" / "clones" / "example+calc" / "HEAD").is_file()  # cloned, bare


def test_a_record_can_name_its_own_environment_and_a_unittest_command_sets_the_runner(
    tmp_path: Path, upstream: dict[str, str]
) -> None:
    own = {"setup": ["python3 -m venv /opt/baton/venv"], "test": "python -m unittest discover"}
    path = write_jsonl(tmp_path / "set.jsonl", record(upstream, environment=own))

    (instance,) = load_records(path, Repos(folder=tmp_path / "repos"), tmp_path / "work")

    assert instance.environment == own
    assert instance.tests.runner == "unittest"


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (["{not json"], ":1: not a JSON object"),
        (["[1, 2]"], ":1: not a JSON object"),
        ([{}, {"patch": None}], ":2: patch: Field required"),
        ([{"FAIL_TO_PASS": '["a"'}], ":1: FAIL_TO_PASS: not a JSON list of test ids"),
        ([{"FAIL_TO_PASS": "[]"}], ":1: FAIL_TO_PASS: Tuple should have at least 1 item"),
        ([{"PASS_TO_PASS": '"x"'}], ":1: PASS_TO_PASS: Input should be a valid tuple"),
        ([{"base_commit": "abc"}], ":1: base_commit: String should match pattern"),
        ([{"repo": "calc"}], ":1: repo: String should match pattern"),
        ([{"problem_statement": ""}], ":1: problem_statement: String should have at least 1"),
        ([{"stars": 3}], ":1: stars: Extra inputs are not permitted"),
        ([{"environment": {"test": ["a"]}}], ":1: environment: environment: test must be one"),
        ([{}, "", {}], ":3: instance_id: 'example__calc-12' repeats line 1"),
        ([{"base_commit": "f" * 40}], ":1: base_commit: ffffffffff"),
        ([{"repo": "example/other"}], ":1: repo: example/other is not a git repository at"),
    ],
)  # fmt: skip
def test_a_malformed_record_is_refused_naming_the_line_and_field_with_nothing_written(
    tmp_path: Path, upstream: dict[str, str], lines: list[str | dict[str, Any]], said: str
) -> None:
    """Each line: as written, or a good record with these fields changed (None: left out)."""
    made = [line if isinstance(line, str) else record(upstream, **line) for line in lines]
    path = write_jsonl(tmp_path / "set.jsonl", *made)
    work = tmp_path / "work"

    with pytest.raises(CorpusError) as raised:
        load_records(path, Repos(folder=tmp_path / "repos"), work)

    assert str(raised.value).startswith(f"{path}:"), raised.value
    assert said in str(raised.value), raised.value
    assert not work.exists() or list(work.rglob("*")) == []


def test_a_bad_file_or_repo_option_is_named(tmp_path: Path, upstream: dict[str, str]) -> None:
    listed = tmp_path / "set.json"
    listed.write_text(json.dumps({"instance_id": "x"}))
    with pytest.raises(CorpusError, match=r"set\.json: not a JSON list of SWE-bench records"):
        read_records(listed)
    listed.write_text(json.dumps([record(upstream), record(upstream, patch="")]))
    with pytest.raises(CorpusError, match=r"set\.json: record 2: patch: String should have"):
        read_records(listed)
    other = tmp_path / "set.csv"
    other.write_text("")
    with pytest.raises(CorpusError, match=r"set\.csv: a SWE-bench file is \.jsonl or \.json"):
        read_records(other)
    empty = write_jsonl(tmp_path / "empty.jsonl", "")
    with pytest.raises(CorpusError, match="no SWE-bench record"):
        read_records(empty)
    with pytest.raises(CorpusError, match=r"--repo 'calc=/x': give owner/name=PATH_OR_URL"):
        parse_repo_option(("calc=/x",))
    assert parse_repo_option(("a/b=/x", "c/d=https://h/c/d.git")) == {
        "a/b": "/x", "c/d": "https://h/c/d.git"
    }  # fmt: skip
    path = write_jsonl(tmp_path / "set.jsonl", record(upstream))
    with pytest.raises(CorpusError, match=r"set\.jsonl:1: repo: no repository for example/calc"):
        load_records(path, Repos(), tmp_path / "work")
    with pytest.raises(CorpusError, match=r"set\.jsonl: no record nope"):
        load_records(path, Repos(folder=tmp_path / "repos"), tmp_path / "work", ("nope",))


def test_baton_eval_refuses_a_bad_record_before_starting_anything(
    tmp_path: Path, upstream: dict[str, str]
) -> None:
    path = write_jsonl(tmp_path / "set.jsonl", record(upstream), record(upstream, repo="x"))

    done = CliRunner().invoke(eval_command, [str(path), "--repos", str(tmp_path / "repos")])

    assert done.exit_code == 2, done.output
    said = f"{path}:2: repo: String should match pattern"
    assert "".join(said.split()) in "".join(done.output.split())  # rich wraps a long path
    folder = CliRunner().invoke(eval_command, [str(tmp_path), "--repos", str(tmp_path)])
    assert folder.exit_code == 2
    refused = "--repos and --repo are for a SWE-bench file, not a folder"
    assert "".join(refused.split()) in "".join(folder.output.split())


def test_a_folder_inside_another_repository_is_not_taken_for_the_record_s(
    tmp_path: Path, upstream: dict[str, str], git: Git
) -> None:
    """--repos DIR inside a work tree: DIR/name is a plain folder of that tree, not a
    repository, even though git finds the enclosing one from there."""
    outer = tmp_path / "outer"
    (outer / "repos" / "calc").mkdir(parents=True)
    git("init", "-q", outer)
    path = write_jsonl(tmp_path / "set.jsonl", record(upstream))

    with pytest.raises(CorpusError, match=r"set\.jsonl:1: repo: example/calc is not a git"):
        load_records(path, Repos(folder=outer / "repos"), tmp_path / "work")
