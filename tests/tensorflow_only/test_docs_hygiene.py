"""Every file a user reads states current facts, not history.

README.md, CHANGELOG.md, docs/*.md, benchmarks/ (its README, scripts and
shell script), examples/*.py, scripts/*, tests/README.md and
pyproject.toml hold no date, commit hash, load average or issue number, and
no phrase telling how the code came to be ("336 lines, from 876", "saved
before this change", "in this session"): history lives in git. The
examples' `--help` texts are checked too (slow: a fresh process each). A
failure names the file and line. No TensorFlow here, except in the
`--help` runs.
"""

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CHECKED = sorted(
    [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "pyproject.toml", REPO / "tests" / "README.md",
     REPO / "benchmarks" / "README.md", REPO / "benchmarks" / "gpu_run.sh"]
    + list((REPO / "docs").glob("*.md"))
    + list((REPO / "benchmarks").glob("*.py"))
    + list((REPO / "examples").glob("*.py"))
    + [path for path in (REPO / "scripts").iterdir() if path.is_file()]
)
EXAMPLES = sorted((REPO / "examples").glob("*.py"))

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
    "how the code was written": re.compile(
        r"\blines, from \d|\bbefore this change\b|\bthis session\b|\bthe code before (?:it|this)\b",
        re.IGNORECASE),
}


def findings(text: str) -> list:
    """(line number, what, matched text) of each forbidden detail."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            found += [(number, what, match.group(0)) for match in pattern.finditer(line)]
    return found


def _report(where: str, text: str) -> list:
    return [f"{where}:{line}: {what}: {found!r}" for line, what, found in findings(text)]


@pytest.mark.parametrize("path", CHECKED, ids=[path.relative_to(REPO).as_posix() for path in CHECKED])
def test_user_files_hold_no_history(path):
    found = _report(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"))
    assert not found, ("State current facts; dates, commit hashes, load averages, issue numbers and how the "
                       "code was written belong in git:\n" + "\n".join(found))


def test_the_scan_covers_every_kind_of_user_file():
    names = {path.relative_to(REPO).as_posix() for path in CHECKED}
    for expected in ("README.md", "CHANGELOG.md", "pyproject.toml", "benchmarks/README.md",
                     "benchmarks/gpu_run.sh", "scripts/test_versions.sh", "docs/api.md"):
        assert expected in names
    assert any(name.startswith("examples/") for name in names)
    assert any(name.startswith("benchmarks/bench_") for name in names)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_help_holds_no_history(path):
    # The help text as the user sees it (defaults filled in), from a fresh process.
    run = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={"TF_CPP_MIN_LOG_LEVEL": "3", **__import__("os").environ})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout
    found = _report(f"{path.name} --help", run.stdout)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text, what", [
    ("measured on 2026-12-03", "a date"),
    ("as of December 3", "a date"),
    ("on 3 Dec the run", "a date"),
    ("in March 2026", "a date"),
    ("code 270c612", "a commit hash"),
    ("at 1f59c98e0a3b", "a commit hash"),
    ("load average 1.8", "a load average"),
    ("issue 18's targets", "an issue number"),
    ("(336 lines, from 876)", "how the code was written"),
    ("files saved before this change do not load", "how the code was written"),
    ("measured in this session", "how the code was written"),
    ('[benchmarks/README.md, "Deploy (2026-12-03)"](../benchmarks/README.md#deploy)', "a date"),
])
def test_findings_catch(text, what):
    assert [found[1] for found in findings(text)] == [what]


def test_a_planted_bad_line_fails_the_file_check(tmp_path):
    # The same check as test_user_files_hold_no_history, on a file with one bad line.
    bad = tmp_path / "notes.md"
    bad.write_text("# Notes\n\nAll current.\nMeasured on 2026-12-03 at code 270c612.\n", encoding="utf-8")
    found = _report("notes.md", bad.read_text(encoding="utf-8"))
    assert found == ["notes.md:4: a date: '2026-12-03'", "notes.md:4: a commit hash: '270c612'"]


@pytest.mark.parametrize("text", [
    "marginals 0 and tags 0",                      # "mar" is no month
    "Maybe 5 steps; 1,041,213 parameters; added",  # words and numbers
    "deadbeef and 1234567",                        # hex without a digit, digits without a letter
    "keras-team/keras#20585",                      # an upstream issue, by its repository
    "two lines, from the top",                     # "lines, from" without a count
])
def test_findings_pass(text):
    assert findings(text) == []
