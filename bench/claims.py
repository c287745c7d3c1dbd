"""What counts as a figure in the docs, and where one may stand (shared/STYLE.md, "Claims").

Two rules, checked over README.md and docs/*.md (`problems`; tests/bench/test_generated_docs.py,
tests/test_docs.py):

1. **A generated section shows only its results file's figures.** Every figure in it is a number
   of the results file (a value, a key, a number inside a string such as the date), or one its
   renderer computed from them (`Source.derive`), printed as it was or as a percentage (`:.1%`)
   or in milliseconds (seconds × 1000). A figure is a number standing on its own: not part of a
   word or an id (`p50`, `h3`, `94c0bc9`, `x16`) and not an enumerator like `(2)`.
2. **Prose carries no measurement.** Outside generated sections, a number with a unit of time,
   size, share, ratio, tokens or rate (`15 ms`, `2 MB`, `7.9 %`, `2.3×`, `12,000 tokens`,
   `7.8 runs/min`), or a count of the form `N of M`, is taken for a measurement, and so is a
   number written as a word (one to ninety-nine, "a dozen": `WORDED`) with a unit or before a
   noun that counts results (`eleven real bugs`, `nine projects`, `twenty of 20`), except
   - in code (a code span or a fenced block: a command, a setting, a literal value), and
   - where `ALLOWED` lists it: a limit, a default or a test's input, by document, with why.
   Keep `ALLOWED` small: a default is better written as its setting in a code span.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import docs

FIGURE = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
"""A number standing on its own in a document (`1,331`, `7.9`, `2.28` of `2.28×`)."""
ANY_NUMBER = re.compile(r"\d+(?:\.\d+)?")
"""A number anywhere in a results file's string or key (`2026-12-01 19:50`, `x16`)."""
_NUMBER = r"(?<![\w.,/-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_UNITS_GLUED = r"ms|µs|KB|KiB|MB|MiB|GB|GiB|%|×"
"""Units that may follow a number without a space (`15ms`, `7.9%`, `3×`)."""
_UNITS_SPACED = (
    r"s|sec|seconds?|min|minutes?|h|hours?|x|B|bytes|tokens|runs/min|runs per minute"
    r"|requests per minute|calls per minute|K"
)
"""Units after a space (`30 s`; `429s` is HTTP's, not a duration)."""
MEASUREMENT = re.compile(
    rf"{_NUMBER}(?:\s?(?:{_UNITS_GLUED})|\s(?:{_UNITS_SPACED}))(?![\w])"
    rf"|{_NUMBER} of {_NUMBER}(?![\w])"
)
"""A number that reads as a measurement in prose: a unit after it, or `N of M`."""
_ONES = r"one|two|three|four|five|six|seven|eight|nine"
_WORD = (
    rf"(?:(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?:{_ONES}))?"
    rf"|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen"
    rf"|{_ONES}|a dozen)"
)
"""A number from one to ninety-nine written as words (`eleven`, `twenty-one`), or "a dozen"."""
_WORD_UNITS = (
    r"milliseconds?|seconds?|minutes?|hours?|days?|bytes|kilobytes|megabytes|tokens|percent"
    r"|per ?cent|times (?:faster|slower|as|more|less|fewer|the)|runs|(?:runs|calls|requests)"
    r" (?:a|per) (?:second|minute)|retries|iterations"
)
"""Units a worded number measures, right after it (`five seconds`, `three times faster`)."""
_COUNTED = (
    r"bugs?|projects?|instances?|fixes|failures|publications|repositories|packages|issues"
    r"|regressions|errors"
)
"""Nouns (and outcomes) whose count is a result: a corpus's size, what a run achieved."""
_NOT_BETWEEN = (
    r"(?:that|which|who|the|a|an|and|or|of|to|in|on|at|by|for|with|is|are|was|were|it|its"
    r"|each|every|per|than|as)"
)
"""Words that end the noun phrase a worded number begins (`one stage that runs`)."""
_COUNT = rf"(?<![\w-])(?<!the )(?<!the\n)(?<!'s )(?<!'s\n)(?!one\b)(?:{_WORD})"
"""A worded number that counts: not "one" (an article as often as a count), not after "the"
or a possessive, which name a set (`the two commands`, `tomli's two instances`)."""
WORDED = re.compile(
    rf"(?<![\w-])(?:{_WORD}|\d+)\s+of\s+(?:the\s+)?{_WORD}(?![\w-])"
    rf"|(?<![\w-]){_WORD}\s+of\s+(?:the\s+)?{_NUMBER}(?![\w])"
    rf"|{_COUNT}\s+(?:{_WORD_UNITS})(?![\w-])"
    rf"|{_COUNT}(?:\s+(?!{_NOT_BETWEEN}\b)[\w-]+){{0,2}}?\s+(?:{_COUNTED})(?![\w-])",
    re.IGNORECASE,
)
"""A number written as a word that reads as a measurement in prose: `N of M` with either one a
word (`twenty of 20`, `nine of the eleven`), a unit after it (`five seconds`), or a count of
results, with at most two words between (`eleven real bugs`, `nine PyPI projects`)."""
CODE_SPAN = re.compile(r"`(?:[^`\n]|\n(?!\n))*`")
"""Inline code, which may wrap onto the next line but not past a paragraph's end."""

ALLOWED: Mapping[str, Mapping[str, str]] = {
    "docs/usage.md": {
        "2 MB": "the largest payload `baton enqueue` accepts (`IntakeLimits.max_payload_bytes`)",
    },
    "docs/inspection.md": {
        "64 KB": (
            "the largest request body `baton serve` accepts (orchestrator/control/server/auth.py)"
        ),
    },
    "docs/testing.md": {
        "20 MB": "the blob in the repository the environment tests copy in (their input)",
        "12 MB": "the artifact the API test streams in ranges (its input)",
    },
}
"""Figures prose may carry, by document: limits, defaults and tests' inputs, never a result."""


def figures(text: str) -> Iterator[str]:
    """The figures in `text`, as written (`1,331`, `7.9`), enumerators like `(2)` left out."""
    for match in FIGURE.finditer(text):
        start, end = match.span()
        if text[start - 1 : start] == "(" and text[end : end + 1] == ")":
            continue
        yield match.group()


def numbers(value: Any) -> Iterator[float]:
    """Every number in a results file's value: numbers, and those in its keys and strings."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, str):
        yield from (float(n) for n in ANY_NUMBER.findall(value))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from numbers(str(key))
            yield from numbers(item)
    elif isinstance(value, Iterable):
        for item in value:
            yield from numbers(item)


def _shown(figure: str) -> tuple[float, int]:
    plain = figure.replace(",", "")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    return float(plain), decimals


def traced(figure: str, candidates: Iterable[float]) -> bool:
    """Whether `figure` is one of `candidates` as a section prints it: as it is, as a
    percentage, or in thousandths (seconds as milliseconds), rounded as the figure is."""
    value, decimals = _shown(figure)
    wanted = f"{value:.{decimals}f}"
    for number in candidates:
        shown = (f"{number:.{decimals}f}", f"{number:.{decimals}%}"[:-1],
                 f"{number * 1000:.{decimals}f}")  # fmt: skip
        if wanted in shown:
            return True
    return False


def untraced(body: str, sources: Sequence[docs.Source]) -> list[str]:
    """The figures of a generated section's `body` that are in none of `sources` (each after
    its renderer ran, so that what it derived is known)."""
    candidates = sorted({n for s in sources for n in (*numbers(s.data), *s.derived)})
    return [f for f in figures(body) if not traced(f, candidates)]


def section_problems(section: docs.Section, root: Path = docs.ROOT) -> list[str]:
    """Why a generated section does not hold to rule 1, or does not name where it is from."""
    sources = docs.load(section.path, root)
    docs.render(section.kind, sources)
    found = [
        f"{section.label}: figure {figure} is in no results figure of {section.path}"
        for figure in untraced(section.body, sources)
    ]
    if section.path.endswith(".json"):
        for named in (section.path, sources[0]["commit"], sources[0]["date"]):
            if named not in section.body:
                found.append(f"{section.label}: does not name {named!r}")
    return found


def prose(text: str) -> str:
    """`text` without what rule 2 leaves out: generated sections, comments, code, link
    targets. Line breaks stay, so that line numbers still count."""

    def blank(match: re.Match[str]) -> str:
        return "\n" * match.group().count("\n")

    text = docs.MARKER.sub(blank, text)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.DOTALL)
    text = re.sub(r"^```.*?^```", blank, text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(CODE_SPAN, blank, text)
    return re.sub(r"\]\([^)\s]*\)", "]", text)


def measurements(doc: Path, root: Path = docs.ROOT) -> list[str]:
    """The measurements in `doc`'s prose that `ALLOWED` does not list, as `path:line: figure`."""
    name = doc.relative_to(root).as_posix()
    allowed = ALLOWED.get(name, {})
    text = prose(doc.read_text())
    found = []
    for match in sorted((*MEASUREMENT.finditer(text), *WORDED.finditer(text)), key=_start):
        said = " ".join(match.group().split())  # a worded count may wrap onto the next line
        if said not in allowed:
            number = text.count("\n", 0, match.start()) + 1
            found.append(f"{name}:{number}: {said!r} in prose (rule 2 of bench/claims.py)")
    return found


def _start(match: re.Match[str]) -> int:
    return match.start()


def problems(root: Path = docs.ROOT) -> list[str]:
    """Every breach of both rules in README.md and docs/*.md."""
    found = []
    for doc in docs.documents(root):
        for section in docs.sections(doc, root):
            found += section_problems(section, root)
        found += measurements(doc, root)
    return found
