"""The user docs state current facts; measurement records stay in
benchmarks/README.md.

README.md and docs/*.md hold no date, commit hash, load average or issue
number, except inside a link to benchmarks/README.md (whose sections carry
them). A failure names the file and line. No TensorFlow here.
"""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECKED = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December"
          "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
FORBIDDEN = {
    "a date": re.compile(
        rf"\b20\d\d-\d\d-\d\d\b"
        rf"|\b(?:{MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?\b"
        rf"|\b\d{{1,2}}(?:st|nd|rd|th)? (?:{MONTHS})\b"
        rf"|\b(?:{MONTHS}),? 20\d\d\b"
    ),
    # 7 to 40 hex digits with at least one letter and one digit.
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "a load average": re.compile(r"load average", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
}
# A Markdown link to benchmarks/README.md (its text may name a dated section).
BENCHMARK_LINK = re.compile(r"\[[^\]]*\]\((?:\.\./)?benchmarks/README\.md[^)]*\)")


def findings(text: str) -> list:
    """(line number, what, matched text) of each forbidden detail."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = BENCHMARK_LINK.sub("", line)
        for what, pattern in FORBIDDEN.items():
            found += [(number, what, match.group(0)) for match in pattern.finditer(line)]
    return found


@pytest.mark.parametrize("path", CHECKED, ids=[path.relative_to(REPO).as_posix() for path in CHECKED])
def test_docs_hold_no_measurement_records(path):
    where = path.relative_to(REPO).as_posix()
    found = [f"{where}:{line}: {what}: {text!r}" for line, what, text in findings(path.read_text(encoding="utf-8"))]
    assert not found, ("Move dates, commit hashes, load averages and issue numbers to benchmarks/README.md "
                       "and link to it:\n" + "\n".join(found))


@pytest.mark.parametrize("text, what", [
    ("measured on 2026-12-03", "a date"),
    ("as of December 3", "a date"),
    ("on 3 Dec the run", "a date"),
    ("in March 2026", "a date"),
    ("code 270c612", "a commit hash"),
    ("at 1f59c98e0a3b", "a commit hash"),
    ("load average 1.8", "a load average"),
    ("issue 18's targets", "an issue number"),
])
def test_findings_catch(text, what):
    assert [found[1] for found in findings(text)] == [what]


@pytest.mark.parametrize("text", [
    "marginals 0 and tags 0",                      # "mar" is no month
    "Maybe 5 steps; 1,041,213 parameters; added",  # words and numbers
    "deadbeef and 1234567",                        # hex without a digit, digits without a letter
    "keras-team/keras#20585",                      # an upstream issue, by its repository
    '[benchmarks/README.md, "Deploy (2026-12-03, code 270c612)"](../benchmarks/README.md#deploy)',
])
def test_findings_pass(text):
    assert findings(text) == []
