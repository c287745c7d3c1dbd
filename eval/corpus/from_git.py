#!/usr/bin/env python3
"""Make the files of a git instance from an upstream fix commit in a local repository.

    .venv/bin/python eval/corpus/from_git.py GIT_DIR FIX_COMMIT ID

writes, in eval/corpus/ID/: `base.tar.gz` (`git archive` of the fix's parent: the base tree),
`test.patch` (the fix commit's changes to test files) and `gold.patch` (its other changes).
instance.toml and issue.json are written by hand; `verify_host.py ID` then checks the instance.
A fix commit with more than one parent (a merge) is refused.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verify_host import CORPUS, is_test_path


def git(git_dir: Path, *args: str) -> bytes:
    argv = ["git", f"--git-dir={git_dir}", *args]
    return subprocess.run(argv, check=True, capture_output=True, timeout=120).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("fix")
    parser.add_argument("id")
    args = parser.parse_args(argv)
    parents = git(args.git_dir, "rev-list", "--parents", "-n1", args.fix).decode().split()
    if len(parents) != 2:
        print(f"{args.fix}: not a commit with one parent", file=sys.stderr)
        return 2
    fix, base = parents
    folder = CORPUS / args.id
    folder.mkdir(exist_ok=True)
    (folder / "base.tar.gz").write_bytes(git(args.git_dir, "archive", "--format=tar.gz", base))
    changed = git(args.git_dir, "diff", "--name-only", "-z", base, fix).decode().split("\0")
    tests = [p for p in changed if p and is_test_path(p)]
    rest = [p for p in changed if p and not is_test_path(p)]
    for name, paths in (("test.patch", tests), ("gold.patch", rest)):
        diff = git(args.git_dir, "diff", "--binary", "--no-color", base, fix, "--", *paths)
        (folder / name).write_bytes(diff)
    print(f"{args.id}: base {base}, fix {fix}; tests {tests}; gold {rest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
