"""Citations of the Markdown docs in the code: every section a comment or a
docstring names must exist.

The Python files of keras_birnn/, benchmarks/ and examples/ cite a section of
benchmarks/README.md or of docs/<file>.md by its title, as
`benchmarks/README.md, "The first step"`. The title is the start of (or all
of) a Markdown heading of that file: headings there often end with when the
numbers were measured, so `### The first step (2026-12-02, ...)` answers a
citation of "The first step". A citation may run over a line break inside a
comment or a docstring (whitespace and `#` markers are normalised first). A
bare `benchmarks/README.md` is allowed; a section cited by number ("§ 3",
"section 3") is not, since numbers shift when a section is added.

Only comments and string literals are read (`tokenize`), so code never joins a
citation's text. No TensorFlow here: the scan reads files, it imports none.
"""

import bisect
import io
import pathlib
import re
import tokenize

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ("keras_birnn", "benchmarks", "examples")

DOC = r"(?:benchmarks/README\.md|docs/[\w.-]+\.md)"
CITATION = re.compile(rf"({DOC}),\s*\"([^\"]{{1,200}}?)\"")
# "§ 3", "section 3" or "sec. 3" right after a doc's path, or "section 3 of"
# right before it.
BY_NUMBER = re.compile(
    rf"{DOC}[^\")]{{0,40}}?(?:§|\bsections?\s+\d|\bsec\.\s*\d)"
    rf"|(?:§\s*\d[\d.]*|\bsections?\s+\d[\d.]*)\s+(?:of|in)\s+{DOC}"
)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
# String literals; from Python 3.12 an f-string's text is FSTRING_MIDDLE.
STRINGS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def _normalise(text: str) -> str:
    return " ".join(text.split())


def headings(markdown: str) -> list:
    """The headings of a Markdown text, whitespace normalised, outside fenced
    code blocks (a `# comment` in a shell block is no heading)."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            found.append(_normalise(match.group(2)))
    return found


def title_matches(title: str, heading: str) -> bool:
    """`title` is `heading`, or its start up to a word's end: "The first step"
    matches "The first step (2026-12-02)" but not "The first steps"."""
    title = _normalise(title)
    if not heading.startswith(title):
        return False
    rest = heading[len(title):]
    return not rest or not (rest[0].isalnum() or rest[0] == "_")


class _Block:
    """Text of one comment run or one string literal, normalised, with the
    source line of each of its pieces."""

    def __init__(self):
        self.text, self.starts, self.lines = "", [], []

    def add(self, line: int, fragment: str):
        fragment = _normalise(fragment.lstrip().lstrip("#"))
        if not fragment:
            return
        if self.text:
            self.text += " "
        self.starts.append(len(self.text))
        self.lines.append(line)
        self.text += fragment

    def line_at(self, offset: int) -> int:
        return self.lines[bisect.bisect_right(self.starts, offset) - 1]


def blocks(source: str) -> list:
    """The comments and string literals of Python `source`: comments on
    adjacent lines make one block (a comment citing a section may wrap), a
    string literal is one block (a docstring wraps too)."""
    found, comment, last_comment_line = [], None, None
    skipped = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            if comment is None or last_comment_line != line - 1:
                comment = _Block()
                found.append(comment)
            comment.add(line, token.string)
            last_comment_line = line
            continue
        if token.type in skipped:
            continue
        comment = None
        if token.type in STRINGS:
            string = _Block()
            for i, fragment in enumerate(token.string.split("\n")):
                string.add(token.start[0] + i, fragment)
            found.append(string)
    return found


def scan(source: str):
    """(citations, numbered): the (line, doc, title) of each section cited by
    title, and the (line, text) of each section cited by number."""
    citations, numbered = [], []
    for block in blocks(source):
        for match in CITATION.finditer(block.text):
            citations.append((block.line_at(match.start()), match.group(1), _normalise(match.group(2))))
        for match in BY_NUMBER.finditer(block.text):
            numbered.append((block.line_at(match.start()), match.group(0)))
    return citations, numbered


def _files():
    for top in SCANNED:
        yield from sorted((REPO / top).rglob("*.py"))


def _all_citations():
    citations, numbered = [], []
    for path in _files():
        found, by_number = scan(path.read_text(encoding="utf-8"))
        where = path.relative_to(REPO).as_posix()
        citations += [(where, line, doc, title) for line, doc, title in found]
        numbered += [(where, line, text) for line, text in by_number]
    return citations, numbered


def test_every_cited_section_exists():
    citations, _ = _all_citations()
    assert citations, "the scan found no citations at all: is the pattern still right?"
    docs, missing = {}, []
    for where, line, doc, title in citations:
        if doc not in docs:
            path = REPO / doc
            docs[doc] = headings(path.read_text(encoding="utf-8")) if path.is_file() else None
        if docs[doc] is None:
            missing.append(f'{where}:{line}: {doc}, "{title}": {doc} does not exist')
        elif not any(title_matches(title, heading) for heading in docs[doc]):
            missing.append(f'{where}:{line}: {doc}, "{title}": no heading of {doc} starts with it')
    assert not missing, "Cited sections that are missing:\n" + "\n".join(missing)


def test_no_section_is_cited_by_number():
    _, numbered = _all_citations()
    found = [f"{where}:{line}: {text!r}" for where, line, text in numbered]
    assert not found, ("Cite a section by its title (benchmarks/README.md, \"Title\"), "
                       "not by number:\n" + "\n".join(found))


# The scanner itself, on made-up sources.


def test_scan_reads_citations_across_line_breaks():
    source = (
        'def f():\n'
        '    """Slow (benchmarks/README.md, "What a\n'
        '    compilation costs and saves")."""\n'
        '    x = 1  # as measured (docs/design.md, "The\n'
        '    # loop")\n'
        '    return x\n'
    )
    citations, numbered = scan(source)
    assert citations == [(2, "benchmarks/README.md", "What a compilation costs and saves"),
                         (4, "docs/design.md", "The loop")]
    assert numbered == []


def test_scan_allows_a_bare_mention():
    source = ('# benchmarks/README.md holds the numbers; docs/deploy.md, too.\n'
              '"""See benchmarks/README.md."""\n')
    assert scan(source) == ([], [])


@pytest.mark.parametrize("text", [
    "benchmarks/README.md, § 3",
    "benchmarks/README.md §3.2",
    "benchmarks/README.md, section 4",
    "section 4 of benchmarks/README.md",
    "docs/design.md (sec. 2)",
])
def test_scan_flags_a_section_cited_by_number(text):
    _, numbered = scan(f"# as measured ({text}).\n")
    assert [line for line, _ in numbered] == [1]


def test_scan_ignores_code_between_comments():
    # A string in code is its own block: it does not join the comment above.
    source = '# benchmarks/README.md, "Speed\nx = "in code"\n'
    assert scan(source) == ([], [])


def test_title_matches_a_heading_start_at_a_word_end():
    heading = "The first step (2026-12-02, 16:48 UTC)"
    assert title_matches("The first step", heading)
    assert title_matches(heading, heading)
    assert not title_matches("The first step", "The first steps")
    assert not title_matches("The second step", heading)


def test_headings_skip_fenced_code():
    markdown = "# Top\n\n```bash\n# not a heading\n```\n\n### Variable lengths\n"
    assert headings(markdown) == ["Top", "Variable lengths"]


# The Markdown docs cite sections the same way, by title: `benchmarks/README.md,
# "Title"` or `[deploy.md](deploy.md), "Title"`.
MARKDOWN_CITATION = re.compile(
    r"(benchmarks/README\.md|\b[\w-]+\.md)(?:\]\([^)]*\))?,\s+\"([^\"]{1,200}?)\"")


def _markdown_citations():
    for path in [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")):
        text = _normalise(path.read_text(encoding="utf-8"))
        for match in MARKDOWN_CITATION.finditer(text):
            doc = match.group(1)
            if doc != "benchmarks/README.md":
                doc = doc if (REPO / doc).is_file() else f"docs/{doc}"
            yield path.relative_to(REPO).as_posix(), doc, _normalise(match.group(2))


def test_every_section_the_docs_cite_exists():
    found = list(_markdown_citations())
    assert found, "the scan found no citations in the docs: is the pattern still right?"
    missing = []
    for where, doc, title in found:
        path = REPO / doc
        if not path.is_file():
            missing.append(f'{where}: {doc}, "{title}": {doc} does not exist')
        elif not any(title_matches(title, heading) for heading in headings(path.read_text(encoding="utf-8"))):
            missing.append(f'{where}: {doc}, "{title}": no heading of {doc} starts with it')
    assert not missing, "Sections the docs cite that are missing:\n" + "\n".join(missing)
