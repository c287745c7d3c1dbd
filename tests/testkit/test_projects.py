"""testkit.projects under pytest-xdist: test processes asking for the same project at once
share one download and one unpacked tree, each finding it whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # fetches from PyPI

ASK = """
import sys
from pathlib import Path
from testkit.projects import python_sdist
root = python_sdist("six", "1.16.0", Path(sys.argv[1]))
print(root, (root / "six.py").stat().st_size)
"""


def test_processes_asking_for_one_sdist_at_once_all_get_it_whole(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    root = Path(__file__).resolve().parents[2]
    asking = [
        subprocess.Popen(
            [sys.executable, "-c", ASK, str(cache)],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    answers = [process.communicate(timeout=300) for process in asking]

    assert [process.returncode for process in asking] == [0] * 4, answers
    printed = {out.strip() for out, _ in answers}
    assert len(printed) == 1  # the same tree, the same six.py, for each
    where, size = printed.pop().split()
    assert Path(where) == cache / "six-1.16.0" and int(size) > 0
    assert (cache / "six-1.16.0" / ".complete").is_file()
    assert [p.name for p in (cache / "downloads" / "six-1.16.0").iterdir()] == ["six-1.16.0.tar.gz"]
