"""What the demo and the examples share: argument checks, their default
data (`add_data_arguments`, `fetch_data_or_exit`), epoch times and their
input pipelines' options.

`python -m keras_birnn.demo` and every script in examples/ complete and
check their parsed command lines here, so that a bad flag stops them the
same way: argparse's usage line and a message naming the flag, exit code 2.
Their `--report-json` files take each epoch's seconds from `EpochTimer`.
"""

import argparse
import os
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import keras

from keras_birnn.data import downloads
from keras_birnn.tagging.batching import without_autotuning  # noqa: F401  (the examples' import)

# `--layers`: keras_birnn's layers, or the same model from Keras's own (the
# "twin" each example builds, an end-to-end benchmark against them).
LAYERS = ("kb", "keras")


def check_layers(layers: str) -> str:
    """`layers` when it is one of `LAYERS`, else a ValueError naming it."""
    if layers not in LAYERS:
        raise ValueError(f"`layers` must be one of {LAYERS}, received {layers!r}.")
    return layers


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


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `--data-dir`, `--cache-dir` and `--data-url`, the flags that
    `fetch_data_or_exit` reads (see `keras_birnn.data.downloads`)."""
    parser.add_argument(
        downloads.DATA_FLAG, dest="data_dir", metavar="DIR", default=None,
        help=f"a local copy of the default data, DIR/<data set>/<file> (e.g. DIR/sentence_polarity/"
        f"rt-polarity.pos), used without network when its SHA-256 checksums match; default: "
        f"${downloads.DATA_ENV}, else the files are downloaded (once: they are cached)",
    )
    parser.add_argument("--cache-dir", metavar="DIR", default=None,
                        help="where downloads are kept, DIR/datasets/keras_birnn/ (default: Keras's "
                        "cache, $KERAS_HOME or ~/.keras)")
    parser.add_argument("--data-url", metavar="URL", default=None,
                        help="download URL/<data set>/<file>, a web server over a copy laid out as "
                        "--data-dir, the checksums still applying (default: the data's public source, "
                        "keras_birnn.data.downloads.DATASETS)")


def fetch_data_or_exit(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    name: str,
    files: Optional[Sequence[str]] = None,
) -> Dict[str, str]:
    """`downloads.fetch_data(name, files)` with the flags of
    `add_data_arguments`; a file that cannot be had (no mirror, no
    network) or fails its checksum stops through `parser.error` (exit
    code 2), with the URL, the flags and the hashes in the message.

    Returns:
        `{file name: local path}`.
    """
    try:
        return downloads.fetch_data(
            name, files, data_dir=args.data_dir, cache_dir=args.cache_dir, base_url=args.data_url
        )
    except (downloads.DataUnavailableError, downloads.ChecksumError) as error:
        parser.error(f"the default data, {name}: {error}")


class EpochTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch of `model.fit`.

    `seconds`: the training part of each epoch (up to its validation pass,
    or to the epoch's end without one); `validation_seconds`: the
    validation passes `fit` runs (`validation_data`), one per epoch that
    has one. Keras's `History` records no times.

    Example:

    ```python
    timer = EpochTimer()
    model.fit(train, validation_data=dev, epochs=2, callbacks=[timer])
    timer.seconds, timer.validation_seconds    # ([41.2, 30.8], [3.1, 2.9])
    ```
    """

    def __init__(self):
        super().__init__()
        self.seconds: List[float] = []
        self.validation_seconds: List[float] = []
        self._began: Optional[float] = None
        self._validating: Optional[float] = None

    def on_epoch_begin(self, epoch, logs=None):
        self._began, self._validating = time.perf_counter(), None

    def on_test_begin(self, logs=None):
        if self._began is not None:  # fit's validation pass, not a separate evaluate()
            self._validating = time.perf_counter()
            self.seconds.append(self._validating - self._began)

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        if self._validating is None:
            self.seconds.append(now - self._began)
        else:
            self.validation_seconds.append(now - self._validating)
        self._began = None
