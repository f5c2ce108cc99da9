"""The shared argument checking of the demo and the examples.

`python -m keras_birnn.demo` and every script in examples/ complete and
check their parsed command lines here, so that a bad flag stops them the
same way: argparse's usage line and a message naming the flag, exit code 2.
"""

import argparse
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union


def finish_args(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    quick: Optional[Dict[str, Tuple]] = None,
    choices: Optional[Tuple[str, Sequence[str]]] = None,
    positive: Sequence[str] = (),
) -> argparse.Namespace:
    """Completes parsed arguments; errors go through `parser.error`.

    Args:
        quick: `{dest: (with --quick, without)}` defaults for arguments left at None.
        choices: `(dest, allowed)`: a comma-separated value becomes a list of
            allowed names (at least one).
        positive: Arguments that must be at least 1.
    """
    for name, (small, full) in (quick or {}).items():
        if getattr(args, name) is None:
            setattr(args, name, small if args.quick else full)
    if choices:
        dest, allowed = choices
        picked = [v.strip() for v in getattr(args, dest).split(",") if v.strip()]
        unknown = [v for v in picked if v not in allowed]
        if unknown or not picked:
            parser.error(f"--{dest}: unknown {unknown}; choose from {','.join(allowed)}")
        setattr(args, dest, picked)
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def require_files(
    parser: argparse.ArgumentParser,
    files: Union[Mapping[str, Optional[str]], Sequence[Tuple[str, Optional[str]]]],
    hint: str = "",
) -> None:
    """Stops through `parser.error` (exit code 2) when a data file is missing.

    Args:
        files: `{flag: path}` or `(flag, path)` pairs: the flag named in the
            message when its path (given or defaulted) is not a file; None
            paths are skipped.
        hint: appended to the message: which flags to pass, where the data is.
    """
    for flag, path in files.items() if isinstance(files, Mapping) else files:
        if path is not None and not os.path.isfile(path):
            parser.error(f"{flag}: no file {path!r}" + (f"; {hint}" if hint else ""))
