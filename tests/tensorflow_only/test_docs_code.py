"""The code shown in the docs runs.

Every ```python block of a documented Markdown file (README.md and
docs/*.md) is run: the blocks of one file in order, in one namespace, in a
fresh Python process on TensorFlow whose working folder is a temporary one
(the blocks write SavedModels and `.keras` files, and set global state such
as a mixed-precision policy). A block that cannot run here is marked by an
HTML comment on the line right before it, `<!-- skip-test: why -->`; the
test lists every skip, and `test_skips_are_few` keeps them rare.

Every ```bash line that runs `python examples/<name>.py` or `python -m
keras_birnn...` must name a script or module that exists, and each `--flag`
on it must be one of that program's options (its argparse parser, taken
from `parse_args` without running anything).
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tensorflow_only.test_docs_flags import EXAMPLES, option_strings, parser_of

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTED = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
MAX_SKIPS = 3

FENCE = re.compile(r"^ {0,3}```\s*(\w*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*skip-test:\s*(.+?)\s*-->\s*$")


def code_blocks(markdown: str) -> list:
    """(language, first line number, code, skip reason or None) of each fenced
    block of a Markdown text."""
    found, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        previous = lines[start - 1] if start else ""
        skip = SKIP.match(previous)
        found.append((match.group(1), start + 2, "\n".join(body) + "\n", skip.group(1) if skip else None))
        i += 1
    return found


def _where(path: pathlib.Path) -> str:
    return path.relative_to(REPO).as_posix()


def _python_blocks(path):
    return [(line, code, skip) for language, line, code, skip in code_blocks(path.read_text(encoding="utf-8"))
            if language == "python"]


# Runs the blocks one after the other in one namespace; a failure names the block's line.
RUNNER = """
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for line, code in blocks:
    try:
        exec(compile(code, f"{sys.argv[2]}:{line}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"the block at {sys.argv[2]}:{line} failed")
"""


def _cheapest_first(paths):
    # The fast subset runs the first case: the file with the least code.
    return sorted(paths, key=lambda path: sum(len(code) for _, code, _ in _python_blocks(path)))


# README.md's two blocks (the recipes) run in tests/tensorflow_only/test_readme.py, with
# assertions on their numbers: not a second time here.
DOCS_WITH_CODE = [path for path in _cheapest_first(DOCUMENTED)
                  if _python_blocks(path) and path.name != "README.md"]


@pytest.mark.slow(reason="a fresh TensorFlow process per file, training and exports: 10 s to 2 min a file; "
                         "test_code_blocks_parse is the fast subset's check")
@pytest.mark.parametrize("path", DOCS_WITH_CODE, ids=[path.name for path in DOCS_WITH_CODE])
def test_python_blocks_run(path, tmp_path):
    blocks = [(line, code) for line, code, skip in _python_blocks(path) if skip is None]
    skipped = [f"{_where(path)}:{line}: {skip}" for line, _, skip in _python_blocks(path) if skip]
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", RUNNER, "blocks.json", _where(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    if skipped:
        print("skipped blocks:\n" + "\n".join(skipped))


def test_skips_are_few():
    skips = [f"{_where(path)}:{line}: {skip}" for path in DOCUMENTED for line, _, skip in _python_blocks(path) if skip]
    print("\n".join(skips))
    assert len(skips) <= MAX_SKIPS, "Too many docs blocks are left unrun:\n" + "\n".join(skips)


def test_code_blocks_parse():
    """The cheap check, in the fast subset: every block extracted is valid
    Python, and every fence is closed (an odd count would swallow prose)."""
    bad = []
    for path in DOCUMENTED:
        text = path.read_text(encoding="utf-8")
        assert sum(1 for line in text.splitlines() if FENCE.match(line)) % 2 == 0, f"{_where(path)}: unclosed fence"
        for line, code, _ in _python_blocks(path):
            try:
                compile(code, f"{_where(path)}:{line}", "exec")
            except SyntaxError as error:
                bad.append(f"{_where(path)}:{line}: {error}")
    assert not bad, "\n".join(bad)


# ```bash blocks: the programs and flags they name.

COMMAND = re.compile(r"\bpython3?\s+(?:-u\s+)?(-m\s+keras_birnn[\w.]*|examples/\w+\.py)([^|;&#\n]*)")


def _commands(text: str):
    """(program, flags) of each `python examples/X.py ...` or `python -m
    keras_birnn...` command in a shell text; continuation lines joined."""
    text = text.replace("\\\n", " ")
    for match in COMMAND.finditer(text):
        program = match.group(1).split()[-1]
        flags = [word.split("=", 1)[0] for word in shlex.split(match.group(2), comments=True)
                 if word.startswith("--")]
        yield program, flags


def _parser_for(program: str):
    if program.startswith("examples/"):
        name = program[len("examples/"):-len(".py")]
        assert name in EXAMPLES, f"{program} does not exist"
        return parser_of(name)
    import importlib

    module = importlib.import_module(program)
    assert hasattr(module, "parse_args"), f"python -m {program}: the module has no command line"
    return parser_of(program)


def _bash_commands():
    for path in DOCUMENTED:
        for language, line, code, _ in code_blocks(path.read_text(encoding="utf-8")):
            if language in ("bash", "sh", "shell"):
                for program, flags in _commands(code):
                    yield f"{_where(path)}:{line}", program, flags


def test_commands_name_real_programs_and_flags():
    commands = list(_bash_commands())
    assert commands, "no command found: is the pattern still right?"
    wrong = []
    for where, program, flags in commands:
        try:
            known = option_strings(_parser_for(program))
        except (AssertionError, ImportError) as error:
            wrong.append(f"{where}: {error}")
            continue
        wrong += [f"{where}: {program} has no option {flag}" for flag in flags if flag not in known]
    assert not wrong, "\n".join(wrong)


def test_commands_pattern():
    text = ("python examples/pos_tagging.py \\\n    --train a.conllu --dev=b   # --not-a-flag\n"
            "python -u -m keras_birnn.demo --seed 1 | tee log\n")
    assert list(_commands(text)) == [("examples/pos_tagging.py", ["--train", "--dev"]),
                                     ("keras_birnn.demo", ["--seed"])]
