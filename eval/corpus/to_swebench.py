#!/usr/bin/env python3
"""Write the corpus's git instances as SWE-bench records, one JSON object a line.

    .venv/bin/python eval/corpus/to_swebench.py > eval/corpus/swebench-git.jsonl

Each record is what SWE-bench holds for a task: `instance_id` (`owner__name-NUMBER`, the
number the issue has), `repo`, `base_commit` ([source] commit), `patch` (gold.patch),
`test_patch` (test.patch), `FAIL_TO_PASS` and `PASS_TO_PASS` (JSON text, as SWE-bench stores
them), `problem_statement` (the issue's title, a blank line, its body), `version`,
`environment_setup_commit` (the base) and `hints_text`. `version` is the one the instance gives
setuptools-scm, if any. A record has an `environment` (Baton's addition) only where the
instance's differs from what `baton env detect` finds in the base tree, so `baton eval` on the
file detects the others' as it would for any SWE-bench record.
"""

from __future__ import annotations

import json
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verify_host import CORPUS

from evaluation.corpus import BASE_ARCHIVE, GitSource, Instance, load_corpus, unpack_base
from sandbox.detection import SCM_VERSION_VARIABLE, detection
from sandbox.environment import to_toml


def record(instance: Instance) -> dict[str, object]:
    source = instance.source
    assert isinstance(source, GitSource)
    repo = source.git.removeprefix("https://github.com/")
    version = instance.environment.get("env", {}).get(SCM_VERSION_VARIABLE)
    fields: dict[str, object] = {
        "instance_id": f"{repo.replace('/', '__')}-{instance.issue['number']}",
        "repo": repo,
        "base_commit": source.commit,
        "patch": instance.text("gold.patch"),
        "test_patch": instance.text("test.patch"),
        "FAIL_TO_PASS": json.dumps(list(instance.tests.fail_to_pass)),
        "PASS_TO_PASS": json.dumps(list(instance.tests.pass_to_pass)),
        "problem_statement": f"{instance.title}\n\n{instance.issue['body']}",
        "version": version,
        "environment_setup_commit": source.commit,
        "hints_text": "",
    }
    if detected(instance, version) != instance.environment:
        fields["environment"] = instance.environment
    return {k: v for k, v in fields.items() if v is not None}


def detected(instance: Instance, version: str | None) -> dict[str, object]:
    """What the SWE-bench reader detects for the base tree, as a spec table without the
    fields a corpus instance leaves out (what was detected from which file)."""
    with tempfile.TemporaryDirectory() as tmp:
        unpack_base(instance.folder / BASE_ARCHIVE, Path(tmp) / "tree")
        table = tomllib.loads(to_toml(detection(Path(tmp) / "tree", version=version).spec))
    return {k: v for k, v in table.items() if k not in ("inputs", "languages")}


def main() -> int:
    for instance in load_corpus(CORPUS):
        if isinstance(instance.source, GitSource):
            print(json.dumps(record(instance), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
