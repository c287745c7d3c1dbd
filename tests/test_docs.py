"""README.md and docs/*.md, without services: their hand-written prose carries no measurement
(rule 2 of `bench.claims`), every relative link leads to a file (and heading) that exists, and
the README stays a newcomer's page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import claims, docs

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A path of this repository's source named in prose or code (`orchestrator/core/keys.py`), not one
# inside another project's tree (`toolz/sandbox/tests/test_core.py`).
SOURCE_PATH = re.compile(
    r"(?<![\w/.-])((?:orchestrator|workers|sandbox|testkit|bench|demo|scripts|k8s)/"
    r"[\w./-]*\w\.(?:py|toml|ya?ml|sh|json|md))\b"
)
# A dotted module of Baton's own (`orchestrator.core.queue`), perhaps with an attribute after it
# (`sandbox.` and `testkit.` are left out: settings are spelled `sandbox.warm`).
MODULE = re.compile(r"(?<![\w./-])((?:orchestrator|workers)(?:\.[a-z_][a-z0-9_]*)+)")
DOCUMENTS = docs.documents()


def _ids(doc: Path) -> str:
    return doc.relative_to(docs.ROOT).as_posix()


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """The anchors of `doc`'s headings (outside fenced code), repeats numbered as GitHub does."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.DOTALL | re.MULTILINE)
    found: set[str] = set()
    for match in re.finditer(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        base = slug(match.group(1))
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def broken_links(doc: Path, root: Path = docs.ROOT) -> list[str]:
    """Each relative link of `doc` whose file, or heading, does not exist."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.DOTALL | re.MULTILINE)
    text = re.sub(claims.CODE_SPAN, "", text)
    broken, here = [], doc.relative_to(root).as_posix()
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: — not the repository's
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        name = file.relative_to(root).as_posix() if file.is_relative_to(root) else str(file)
        if not file.exists():
            broken.append(f"{here}: {target} (no {name})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{here}: {target} (no heading #{anchor} in {name})")
    return broken


def stale_names(doc: Path, root: Path = docs.ROOT) -> list[str]:
    """Each source file or module of Baton's that `doc` names and the tree no longer has: a module
    moved (as `orchestrator/settings.py` did to `orchestrator/core/`) leaves no doc pointing at
    its old place. Test files are named relative to `tests/` in places (`workers/test_x.py`), so
    a path also counts as found under `tests/`."""
    text, here = doc.read_text(), doc.relative_to(root).as_posix()
    stale = [
        f"{here}: {path}"
        for path in dict.fromkeys(SOURCE_PATH.findall(text))
        if not (root / path).exists() and not (root / "tests" / path).exists()
    ]
    for dotted in dict.fromkeys(MODULE.findall(text)):
        parts = dotted.split(".")
        # The longest prefix that is a module or package; whatever follows is an attribute.
        if not any(
            (root / Path(*parts[:n])).with_suffix(".py").exists()
            or (root / Path(*parts[:n]) / "__init__.py").exists()
            for n in range(len(parts), 1, -1)
        ):
            stale.append(f"{here}: {dotted}")
    return stale


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_ids)
def test_no_doc_names_a_source_file_or_module_that_moved(doc: Path) -> None:
    assert stale_names(doc) == []


def test_a_moved_file_or_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "orchestrator" / "core").mkdir(parents=True)
    (tmp_path / "orchestrator" / "core" / "keys.py").write_text("")
    (tmp_path / "orchestrator" / "__init__.py").write_text("")
    (tmp_path / "tests" / "workers").mkdir(parents=True)
    (tmp_path / "tests" / "workers" / "test_x.py").write_text("")
    doc = _doc(
        tmp_path, "docs/page.md",
        "`orchestrator/core/keys.py`, `orchestrator/keys.py`, `workers/test_x.py`, "
        "`toolz/sandbox/tests/test_core.py`, `orchestrator.core.keys.run_key`, "
        "`orchestrator.schemas.Proof`\n",
    )  # fmt: skip
    assert stale_names(doc, tmp_path) == [
        "docs/page.md: orchestrator/keys.py",
        "docs/page.md: orchestrator.schemas",
    ]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_ids)
def test_hand_written_prose_carries_no_measurement(doc: Path) -> None:
    assert claims.measurements(doc) == []


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_ids)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(doc: Path) -> None:
    assert broken_links(doc) == []


def test_the_readme_names_both_commands_and_stays_short() -> None:
    text = (docs.ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    assert len(text.encode()) <= 15_360, "README.md is for a newcomer: move the manual to docs/"


def _doc(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "prose",
    ["A warm sandbox is taken in 15 ms.", "It took 2.5 s.", "Baton sends 7.9 % of the tokens.",
     "2.28× the chain's", "11 of 11 wrong fixes", "about 111 KiB", "12,000 tokens a request",
     "7.8 runs/min", "eleven real bugs", "Nine PyPI projects", "twenty of 20 resolved",
     "nine of the eleven", "twenty-one instances", "a dozen projects", "three times faster",
     "in five seconds", "a corpus of eleven real\nbugs"],
)  # fmt: skip
def test_a_measurement_in_prose_is_found(tmp_path: Path, prose: str) -> None:
    doc = _doc(tmp_path, "docs/page.md", f"# Page\n\nSome text.\n{prose}\n")
    found = claims.measurements(doc, tmp_path)
    assert len(found) == 1 and found[0].startswith("docs/page.md:4: ")


@pytest.mark.parametrize(
    "prose",
    ["`BATON_SANDBOX__TTL_S=1800` and `sleep 30 s`", "HTTP 429s and 5xx",
     "Python 3.11, Kubernetes 1.30", "the p50 of h3 at 94c0bc9", "2 cores",
     "one stage", "the two commands", "one run at a time", "one of the workers",
     "tomli's two instances", "one stage that runs the tests", "someone fixes bugs",
     "```sh\ntimeout 30 s\n```", "<!-- 15 ms in a comment -->"],
)  # fmt: skip
def test_code_ids_versions_and_counts_are_not_measurements(tmp_path: Path, prose: str) -> None:
    doc = _doc(tmp_path, "docs/page.md", f"# Page\n\n{prose}\n")
    assert claims.measurements(doc, tmp_path) == []


def test_a_figure_in_a_generated_section_is_left_to_its_results_file(tmp_path: Path) -> None:
    marker = (
        "<!-- generated by make docs: sandbox.warm from bench/results/sandbox.json; do not edit -->"
    )
    doc = _doc(tmp_path, "docs/page.md", f"# Page\n\n{marker}\nin 15 ms\n{docs.END}\nin 16 ms\n")
    assert claims.measurements(doc, tmp_path) == [
        "docs/page.md:6: '16 ms' in prose (rule 2 of bench/claims.py)"
    ]


def test_an_allowed_limit_is_allowed_only_where_it_is_listed(tmp_path: Path) -> None:
    text = "# Usage\n\nPayloads over 2 MB are refused.\n"
    assert claims.measurements(_doc(tmp_path, "docs/usage.md", text), tmp_path) == []
    assert claims.measurements(_doc(tmp_path, "README.md", text), tmp_path) == [
        "README.md:3: '2 MB' in prose (rule 2 of bench/claims.py)"
    ]


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    _doc(tmp_path, "docs/usage.md", "# Using Baton\n\n## The `baton` command\n")
    doc = _doc(
        tmp_path, "docs/page.md",
        "[ok](usage.md#the-baton-command) [gone](missing.md) [no heading](usage.md#nowhere) "
        "[web](https://example.com/x.md) [self](#page)\n\n# Page\n",
    )  # fmt: skip
    assert broken_links(doc, tmp_path) == [
        "docs/page.md: missing.md (no docs/missing.md)",
        "docs/page.md: usage.md#nowhere (no heading #nowhere in docs/usage.md)",
    ]


@pytest.mark.parametrize(
    ("name", "figure"), [(name, f) for name, allowed in claims.ALLOWED.items() for f in allowed]
)
def test_each_allowed_figure_is_still_in_its_document(name: str, figure: str) -> None:
    """An entry whose figure left its document goes too: the list stays as short as it can."""
    assert figure in claims.prose((docs.ROOT / name).read_text())
