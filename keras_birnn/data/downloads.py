"""The examples' default data: where each data set is published, its
SHA-256 checksums, and `fetch_data`, which finds or downloads the files.

Every file is checked against the SHA-256 in `DATASETS` before it is used,
wherever it comes from, so a run trains on the bytes its reported figures
came from. Where a file comes from, in this order:

1. a local mirror, `data_dir` (else the `KERAS_BIRNN_DATA` environment
   variable): a folder laid out as `<data_dir>/<folder>/<file>`, e.g.
   `<data_dir>/sentence_polarity/rt-polarity.pos`; no network is used;
2. the cache of earlier downloads,
   `<cache_dir>/datasets/keras_birnn/<folder>/<file>` (`cache_dir`
   defaults to Keras's, `~/.keras` or `$KERAS_HOME`);
3. a download with `keras.utils.get_file`: from the data set's pinned
   source, or with `base_url` from `<base_url>/<folder>/<file>` (a web
   server over a mirror folder, for users behind a proxy and for tests).

With neither a mirror nor a network, `fetch_data` raises
`DataUnavailableError` naming the URL, `--data-dir` and `KERAS_BIRNN_DATA`.

    >>> import hashlib, os, tempfile
    >>> from keras_birnn.data.downloads import DATASETS, DataSet, fetch_data
    >>> sorted(DATASETS)
    ['conll2000_chunking', 'conll2002_spanish', 'sentence_polarity', 'ud_english_ewt']
    >>> sorted(DATASETS["sentence_polarity"].files)
    ['rt-polarity.neg', 'rt-polarity.pos']

A mirror hit needs no network (here a one-file data set of its own):

    >>> mirror = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(mirror, "tiny"))
    >>> with open(os.path.join(mirror, "tiny", "a.txt"), "wb") as f:
    ...     _ = f.write(b"one line\\n")
    >>> tiny = DataSet("tiny", {"a.txt": hashlib.sha256(b"one line\\n").hexdigest()},
    ...                url="https://example.org/{name}")
    >>> paths = fetch_data("tiny", data_dir=mirror, registry={"tiny": tiny})
    >>> paths["a.txt"] == os.path.join(mirror, "tiny", "a.txt")
    True

The examples' own data (downloaded on first use, then cached):

    >>> paths = fetch_data("ud_english_ewt")  # doctest: +SKIP
    >>> paths["en_ewt-ud-train.conllu"]  # doctest: +SKIP
    '/home/me/.keras/datasets/keras_birnn/ud_english_ewt/en_ewt-ud-train.conllu'
"""

import dataclasses
import hashlib
import os
import shutil
import tempfile
import urllib.error
import zipfile
from typing import Dict, Mapping, Optional, Sequence

import keras

DATA_ENV = "KERAS_BIRNN_DATA"
DATA_FLAG = "--data-dir"


class DataUnavailableError(OSError):
    """A data file is in no mirror and could not be downloaded."""


class ChecksumError(ValueError):
    """A data file's SHA-256 is not the registered one."""


@dataclasses.dataclass(frozen=True)
class DataSet:
    """Where one data set's files are published.

    Args:
        folder: The folder of its files in a mirror and in the cache.
        files: `{file name: SHA-256 of the file}`.
        url: The source: a URL with `{name}` (each file downloaded on its
            own), or an archive's URL (`archive` set).
        archive: With an archive (zip), the folder inside it holding the
            files, `""` for its top level; None when `url` is per file.
        archive_sha256: The archive's SHA-256 (None: checked only through
            its extracted files).
        source: What the source is, for people (the release, its licence).
    """

    folder: str
    files: Mapping[str, str]
    url: str
    archive: Optional[str] = None
    archive_sha256: Optional[str] = None
    source: str = ""


# The commit of UD_English-EWT's release tag r2.16.
_UD_EWT = (
    "https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/4c89b5833a70aa5ed3a00bad2f23f57992cc7df8"
)
# NLTK's data packages (github.com/nltk/nltk_data, branch gh-pages); one
# pinned commit for the three archives, each unchanged since it was added.
_NLTK = "https://raw.githubusercontent.com/nltk/nltk_data/5db857e6f7df11eabb5e5665836db9ec8df07e28/packages/corpora"



def nltk_archive(name: str, archive: str, files: Dict[str, str], archive_sha256: str, source: str) -> DataSet:
    """A data set read from one of NLTK's pinned zip archives."""
    return DataSet(name, files, url=f"{_NLTK}/{archive}.zip", archive=archive,
                   archive_sha256=archive_sha256, source=source)


DATASETS: Dict[str, DataSet] = {
    "ud_english_ewt": DataSet(
        "ud_english_ewt",
        {
            "en_ewt-ud-train.conllu": "3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b",
            "en_ewt-ud-dev.conllu": "531a54ff90d6ab12201c5a50c3e78e6ddac4de69abc4bce5d275d3cd29efe2b6",
        },
        url=_UD_EWT + "/{name}",
        source="Universal Dependencies English EWT, release tag r2.16 (v2.16, 2025-05-15) of "
        "github.com/UniversalDependencies/UD_English-EWT; CC BY-SA 4.0",
    ),
    "conll2002_spanish": nltk_archive(
        "conll2002_spanish",
        "conll2002",
        {
            "esp.train": "a20d95cab7d88a19a86f8c1ad6329325c99fbd9529ed978cbd7e31d4b01b4008",
            "esp.testa": "85c17793b77881c53d19017d9d0f1e6fb98b7ddcab54a5f24b05ed1793103c87",
        },
        "64440e49236d0d393e08e0b266284966d68e2d2a82a50cc41b8e96d98c03b5c8",
        "CoNLL-2002 shared task (https://www.clips.uantwerpen.be/conll2002/ner/), as "
        "distributed with NLTK's data (word POS tag); research use within the shared task only",
    ),
    "conll2000_chunking": nltk_archive(
        "conll2000_chunking",
        "conll2000",
        {"train.txt": "82033cd7a72b209923a98007793e8f9de3abc1c8b79d646c50648eb949b87cea"},
        "01e65164f268366e7caa0db92332a1955d081908c87016e2c7640c3c5279b7cd",
        "CoNLL-2000 shared task (https://www.clips.uantwerpen.be/conll2000/chunking/), "
        "as distributed with NLTK's data; research use",
    ),
    # Not the bytes of Cornell's rt-polaritydata.tar.gz: NLTK converted
    # its Latin-1, CRLF lines to UTF-8, LF (so says NLTK's README.txt).
    "sentence_polarity": nltk_archive(
        "sentence_polarity",
        "sentence_polarity",
        {
            "rt-polarity.pos": "c2dc6b2f55bcf725725372916287cc3f8f9b19402edaa9167de5287cb3ade421",
            "rt-polarity.neg": "614274f81185a850e5a88d533d4679f916d6f62e9af6f0b4ec71fb94bf466ea5",
        },
        "6e1ed4405b65c7eabf1d199a7f7c437091ac21da0ea7467b410a74062574566b",
        "Pang & Lee sentence polarity v1.0 "
        "(https://www.cs.cornell.edu/people/pabo/movie-review-data/), as distributed with "
        "NLTK's data (UTF-8, Unix line ends); CC BY 4.0",
    ),
}


def sha256_file(path) -> str:
    """The hex SHA-256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(os.fspath(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_file(path, expected: str) -> str:
    """`path` when its SHA-256 is `expected`, else a `ChecksumError`
    naming the file and both hashes."""
    received = sha256_file(path)
    if received != expected:
        raise ChecksumError(
            f"{os.fspath(path)}: SHA-256 mismatch: expected {expected}, received {received} "
            "(a different version of the file, or a damaged download)"
        )
    return os.fspath(path)


def fetch_data(
    name: str,
    files: Optional[Sequence[str]] = None,
    *,
    data_dir: Optional[str] = None,
    cache_dir: Optional[str] = None,
    base_url: Optional[str] = None,
    registry: Optional[Mapping[str, DataSet]] = None,
) -> Dict[str, str]:
    """Local paths of a data set's files, each checked by its SHA-256.

    Args:
        name: A key of `registry` (`DATASETS`: "ud_english_ewt",
            "conll2002_spanish", "conll2000_chunking", "sentence_polarity").
        files: The files wanted (default: all the data set's).
        data_dir: A local mirror, `<data_dir>/<folder>/<file>`; None reads
            the `KERAS_BIRNN_DATA` environment variable (unset: no mirror).
            A file found there is used as it is, without network.
        cache_dir: Where downloads are kept: `<cache_dir>/datasets/keras_birnn/<folder>/`
            (default: Keras's cache folder, `$KERAS_HOME` or `~/.keras`).
        base_url: Download `<base_url>/<folder>/<file>` instead of the
            registered source (a mirror over HTTP; plain files, no archive).
        registry: The data sets (default `DATASETS`).

    Returns:
        `{file name: path}`.

    Raises:
        ValueError: an unknown `name` or file.
        ChecksumError: a file (in the mirror, or downloaded) whose SHA-256
            is not the registered one, naming it and both hashes.
        DataUnavailableError: a file in no mirror or cache that could not
            be downloaded, naming the URL, `--data-dir` and `KERAS_BIRNN_DATA`.
    """
    dataset = _lookup(name, files, DATASETS if registry is None else registry)
    wanted = list(dataset.files) if files is None else list(files)
    if data_dir is None:
        data_dir = os.environ.get(DATA_ENV) or None
    paths = {}
    for file in wanted:
        mirrored = data_dir and os.path.join(os.fspath(data_dir), dataset.folder, file)
        if mirrored and os.path.isfile(mirrored):
            paths[file] = check_file(mirrored, dataset.files[file])
    missing = [file for file in wanted if file not in paths]
    if missing:
        paths.update(_from_cache_or_download(dataset, missing, cache_dir, base_url))
    return {file: paths[file] for file in wanted}


def _lookup(name: str, files: Optional[Sequence[str]], registry: Mapping[str, DataSet]) -> DataSet:
    """`registry[name]`, checking `files` against it."""
    if name not in registry:
        raise ValueError(f"`name` must be one of {sorted(registry)}, received {name!r}.")
    dataset = registry[name]
    if files is not None:
        if isinstance(files, str):
            raise TypeError(f"`files` must be a sequence of file names, received the string {files!r}.")
        unknown = [f for f in files if f not in dataset.files]
        if unknown or not files:
            raise ValueError(f"`files` must be some of {sorted(dataset.files)}, received {list(files)!r}.")
    return dataset


def _cache_folder(cache_dir: Optional[str], folder: str) -> str:
    root = cache_dir or os.environ.get("KERAS_HOME") or os.path.join("~", ".keras")
    path = os.path.join(os.path.expanduser(os.fspath(root)), "datasets", "keras_birnn", folder)
    os.makedirs(path, exist_ok=True)  # get_file would otherwise fall back to /tmp/.keras
    return path


def _from_cache_or_download(dataset: DataSet, files: Sequence[str], cache_dir, base_url) -> Dict[str, str]:
    """The cached copies of `files`, downloading the ones that are not
    cached (or whose cached bytes are not the registered ones)."""
    folder = _cache_folder(cache_dir, dataset.folder)
    paths, stale = {}, []
    for file in files:
        path = os.path.join(folder, file)
        if os.path.isfile(path) and sha256_file(path) == dataset.files[file]:
            paths[file] = path
        else:
            stale.append(file)
    if not stale:
        return paths
    if base_url is not None:
        for file in stale:
            url = f"{base_url.rstrip('/')}/{dataset.folder}/{file}"
            paths[file] = _download(url, folder, file, dataset.files[file], [file])
    elif dataset.archive is None:
        for file in stale:
            paths[file] = _download(dataset.url.format(name=file), folder, file, dataset.files[file], [file])
    else:
        paths.update(_from_archive(dataset, stale, folder))
    return paths


def _download(url: str, folder: str, fname: str, sha256: Optional[str], files: Sequence[str]) -> str:
    """`url` saved as `folder/fname` (replacing what is there), checked
    against `sha256` when given; a file that fails the check is removed,
    so the next call downloads it again. `files`: the data files it
    provides, for the message when it cannot be had."""
    target = os.path.join(folder, fname)
    if os.path.exists(target):
        os.remove(target)  # a stale copy: get_file would keep it
    try:
        path = keras.utils.get_file(fname=fname, origin=url, cache_dir=folder, cache_subdir="")
    except Exception as error:  # get_file raises a bare Exception for every URL failure
        cause = error.__context__ if isinstance(error.__context__, urllib.error.URLError) else error
        mirrored = ", ".join(f"DIR/{os.path.basename(folder)}/{file}" for file in files)
        raise DataUnavailableError(
            f"could not download {url} ({cause}). Without network, use a local copy of the data: "
            f"pass {DATA_FLAG} DIR or set {DATA_ENV}=DIR, with {mirrored}"
        ) from error
    if sha256 is not None:
        try:
            check_file(path, sha256)
        except ChecksumError as error:
            os.remove(path)
            raise ChecksumError(f"downloaded from {url}: {error}") from None
    return path


def _from_archive(dataset: DataSet, files: Sequence[str], folder: str) -> Dict[str, str]:
    """Downloads `dataset`'s zip archive, extracts `files` into `folder`
    (each checked), and removes the archive."""
    archive = _download(dataset.url, folder, os.path.basename(dataset.url), dataset.archive_sha256, files)
    paths = {}
    try:
        with zipfile.ZipFile(archive) as zipped:
            for file in files:
                member = f"{dataset.archive}/{file}" if dataset.archive else file
                paths[file] = _extract(zipped, member, os.path.join(folder, file), dataset.files[file])
    finally:
        os.remove(archive)
    return paths


def _extract(zipped: zipfile.ZipFile, member: str, target: str, sha256: str) -> str:
    """`member` of `zipped` written to `target` once its SHA-256 is
    `sha256` (written beside it first, so a bad member leaves nothing)."""
    try:
        source = zipped.open(member)
    except KeyError:
        raise DataUnavailableError(f"{zipped.filename} has no member {member!r}: not the registered archive") from None
    handle, partial = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".part")
    try:
        with source, os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(source, out)
        check_file(partial, sha256)
    except BaseException as error:
        os.remove(partial)
        if isinstance(error, ChecksumError):
            raise ChecksumError(f"{member} of {zipped.filename}: {error}") from None
        raise
    os.replace(partial, target)
    return target
