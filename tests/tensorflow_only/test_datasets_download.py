"""keras_birnn.data.downloads: the examples' data found in a local mirror, in the
cache or downloaded, always checked by SHA-256.

Downloads come from an `http.server` in a thread on 127.0.0.1 that records
every request, serving small generated files from tmp_path (a test
registry) or the shared data folder read-only; "no network" is a port
nothing listens on. The expected hashes are `hashlib`'s of the served bytes.
"""

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import http.server
import os
import re
import socket
import threading
import zipfile

import pytest

from helpers import POLARITY, SHARED_DATA
from keras_birnn.cli import arguments as cli
from keras_birnn.data import downloads
from keras_birnn.data.downloads import DATA_ENV, DATASETS, ChecksumError, DataSet, DataUnavailableError, fetch_data

FILES = {"a.txt": b"alpha\nbeta\n", "b.txt": "gr\u00fc\u00dfe\n".encode("utf-8")}
SHA = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}


class Server:
    """`http.server` over `root` in a thread; `requests` lists the paths asked for."""

    def __init__(self, root):
        self.requests = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):  # keep the test output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def serving(root):
    server = Server(root)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def no_env_mirror(monkeypatch):
    """A KERAS_BIRNN_DATA of the machine running the tests must not answer for them."""
    monkeypatch.delenv(DATA_ENV, raising=False)


@pytest.fixture
def www(tmp_path):
    """The served folder: the files one by one under plain/, as a zip under
    zips/ (inside a folder `tiny/`, as NLTK's archives are), and laid out
    as a mirror (`<folder>/<file>`) under mirror/."""
    root = tmp_path / "www"
    for folder in ("plain", "zips", "mirror/tiny"):
        (root / folder).mkdir(parents=True)
    with zipfile.ZipFile(root / "zips" / "tiny.zip", "w") as zipped:
        zipped.writestr("tiny/README", "not wanted\n")
        for name, data in FILES.items():
            (root / "plain" / name).write_bytes(data)
            (root / "mirror" / "tiny" / name).write_bytes(data)
            zipped.writestr(f"tiny/{name}", data)
    return root


def registry(url, archive=False, sha=None):
    sha = dict(SHA, **(sha or {}))
    if archive:
        return {"tiny": DataSet("tiny", sha, url + "/zips/tiny.zip", archive="tiny")}
    return {"tiny": DataSet("tiny", sha, url + "/plain/{name}")}


def dead_url():
    """A URL of a local port nothing listens on: a refused connection, at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def cached(tmp_path, name):
    return str(tmp_path / "cache" / "datasets" / "keras_birnn" / "tiny" / name)


def test_download_checks_and_caches(www, tmp_path):
    with serving(www) as server:
        paths = fetch_data("tiny", cache_dir=str(tmp_path / "cache"), registry=registry(server.url))
        assert paths == {name: cached(tmp_path, name) for name in FILES}
        assert server.requests == ["/plain/a.txt", "/plain/b.txt"]
        for name, data in FILES.items():
            with open(paths[name], "rb") as f:
                assert f.read() == data
        again = fetch_data("tiny", ["b.txt"], cache_dir=str(tmp_path / "cache"), registry=registry(server.url))
        assert again == {"b.txt": paths["b.txt"]}
        assert len(server.requests) == 2  # the cache answered: no request
        with open(paths["a.txt"], "ab") as f:
            f.write(b"damaged")  # a cached copy that is no longer the registered bytes
        fetch_data("tiny", cache_dir=str(tmp_path / "cache"), registry=registry(server.url))
        assert server.requests[2:] == ["/plain/a.txt"]
    assert downloads.sha256_file(paths["a.txt"]) == SHA["a.txt"]


def test_archive_is_extracted_checked_and_removed(www, tmp_path):
    archive_sha = hashlib.sha256((www / "zips" / "tiny.zip").read_bytes()).hexdigest()
    with serving(www) as server:
        tiny = {"tiny": dataclasses.replace(registry(server.url, archive=True)["tiny"], archive_sha256=archive_sha)}
        paths = fetch_data("tiny", cache_dir=str(tmp_path / "cache"), registry=tiny)
        assert server.requests == ["/zips/tiny.zip"]
        assert sorted(os.listdir(tmp_path / "cache" / "datasets" / "keras_birnn" / "tiny")) == sorted(FILES)
        for name, data in FILES.items():
            with open(paths[name], "rb") as f:
                assert f.read() == data
        fetch_data("tiny", cache_dir=str(tmp_path / "cache"), registry=tiny)
        assert server.requests == ["/zips/tiny.zip"]  # cached: no second download


def test_archive_checksums_name_the_archive_or_the_member(www, tmp_path):
    with serving(www) as server:
        bad_member = registry(server.url, archive=True, sha={"b.txt": "0" * 64})
        message = rf"tiny/b.txt of .*tiny.zip: .*expected 0{{64}}, received {SHA['b.txt']}"
        with pytest.raises(ChecksumError, match=message):
            fetch_data("tiny", cache_dir=str(tmp_path / "cache"), registry=bad_member)
        folder = tmp_path / "cache" / "datasets" / "keras_birnn" / "tiny"
        assert sorted(os.listdir(folder)) == ["a.txt"]  # neither the bad member nor the archive stays
        archive_sha = hashlib.sha256((www / "zips" / "tiny.zip").read_bytes()).hexdigest()
        wrong = {"tiny": dataclasses.replace(registry(server.url, archive=True)["tiny"], archive_sha256="f" * 64)}
        message = rf"tiny.zip: SHA-256 mismatch: expected f{{64}}, received {archive_sha}"
        with pytest.raises(ChecksumError, match=message):
            fetch_data("tiny", ["b.txt"], cache_dir=str(tmp_path / "cache2"), registry=wrong)


def test_checksum_mismatch_names_the_file_and_both_hashes(www, tmp_path):
    with serving(www) as server:
        wrong = registry(server.url, sha={"a.txt": "0" * 64})
        with pytest.raises(ChecksumError) as info:
            fetch_data("tiny", ["a.txt"], cache_dir=str(tmp_path / "cache"), registry=wrong)
    message = str(info.value)
    assert f"downloaded from {server.url}/plain/a.txt" in message and cached(tmp_path, "a.txt") in message
    assert f"expected {'0' * 64}, received {SHA['a.txt']}" in message
    assert not os.path.exists(cached(tmp_path, "a.txt"))  # the next call downloads it again
    other = b"another version\n"
    (www / "mirror" / "tiny" / "a.txt").write_bytes(other)
    with pytest.raises(ChecksumError, match=re.escape(
            f"{www / 'mirror' / 'tiny' / 'a.txt'}: SHA-256 mismatch: expected {SHA['a.txt']}, "
            f"received {hashlib.sha256(other).hexdigest()}")):
        fetch_data("tiny", data_dir=str(www / "mirror"), base_url=dead_url(), registry=registry(dead_url()))


@pytest.mark.parametrize("by", ["argument", "environment"])
def test_mirror_needs_no_network(www, tmp_path, monkeypatch, by):
    mirror = str(www / "mirror")
    if by == "environment":
        monkeypatch.setenv(DATA_ENV, mirror)
    with serving(www) as server:
        paths = fetch_data("tiny", data_dir=mirror if by == "argument" else None,
                           cache_dir=str(tmp_path / "cache"), registry=registry(server.url))
        assert server.requests == []
    assert paths == {name: os.path.join(mirror, "tiny", name) for name in FILES}
    (www / "mirror" / "tiny" / "b.txt").unlink()  # a partial mirror: the rest is downloaded
    with serving(www) as server:
        paths = fetch_data("tiny", data_dir=mirror, cache_dir=str(tmp_path / "cache"), registry=registry(server.url))
        assert server.requests == ["/plain/b.txt"]
    assert paths == {"a.txt": os.path.join(mirror, "tiny", "a.txt"), "b.txt": cached(tmp_path, "b.txt")}


def test_no_network_and_no_mirror_names_the_url_and_the_flags(tmp_path):
    url = dead_url()
    with pytest.raises(DataUnavailableError) as info:
        fetch_data("tiny", cache_dir=str(tmp_path / "cache"), data_dir=str(tmp_path / "empty"), registry=registry(url))
    assert isinstance(info.value, OSError)
    message = str(info.value)
    assert f"could not download {url}/plain/a.txt" in message
    assert "--data-dir DIR" in message and f"{DATA_ENV}=DIR" in message and "with DIR/tiny/a.txt" in message
    assert os.listdir(tmp_path / "cache" / "datasets" / "keras_birnn" / "tiny") == []
    with pytest.raises(DataUnavailableError) as info:  # an archive: the mirror holds its files, not the zip
        fetch_data("tiny", cache_dir=str(tmp_path / "cache"), registry=registry(url, archive=True))
    assert f"could not download {url}/zips/tiny.zip" in str(info.value)
    assert str(info.value).endswith("with DIR/tiny/a.txt, DIR/tiny/b.txt")


def test_example_helper_exits_2_naming_the_url_and_the_flag(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="example")
    cli.add_data_arguments(parser)
    url = dead_url()
    args = parser.parse_args(["--data-url", url, "--cache-dir", str(tmp_path / "cache")])
    with pytest.raises(SystemExit) as stop:
        cli.fetch_data_or_exit(parser, args, "sentence_polarity")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: example")
    assert f"{url}/sentence_polarity/rt-polarity.pos" in err and "--data-dir" in err and DATA_ENV in err
    assert "Traceback" not in err


@pytest.mark.skipif(not os.path.isdir(POLARITY), reason="../shared/data/sentence_polarity absent")
def test_base_url_serves_the_registered_files_from_a_mirror_folder(tmp_path):
    """The real registry's polarity files through `--data-url`, from the
    shared folder served as it is (read-only): their registered hashes hold."""
    with serving(SHARED_DATA) as server:
        parser = argparse.ArgumentParser(prog="example")
        cli.add_data_arguments(parser)
        args = parser.parse_args(["--data-url", server.url + "/", "--cache-dir", str(tmp_path / "cache")])
        paths = cli.fetch_data_or_exit(parser, args, "sentence_polarity")
        assert sorted(server.requests) == ["/sentence_polarity/rt-polarity.neg", "/sentence_polarity/rt-polarity.pos"]
    for name, path in paths.items():
        with open(path, "rb") as got, open(os.path.join(POLARITY, name), "rb") as shared:
            assert got.read() == shared.read()


@pytest.mark.skipif(not os.path.isdir(SHARED_DATA), reason="../shared/data absent")
def test_registry_hashes_are_the_shared_files():
    """Every registered file is in the shared folder with its registered SHA-256
    (hashlib's, computed here), so that folder is a mirror as it stands."""
    for name, dataset in DATASETS.items():
        paths = fetch_data(name, data_dir=SHARED_DATA, base_url=dead_url())
        for file, path in paths.items():
            assert path == os.path.join(SHARED_DATA, dataset.folder, file)
            with open(path, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == dataset.files[file]


def test_registry_sources_are_pinned():
    """Each source is a raw GitHub file at a 40-hex commit, never a branch or tag."""
    pinned = re.compile(r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/\S+")
    for dataset in DATASETS.values():
        assert pinned.fullmatch(dataset.url), dataset.url
        assert ("{name}" in dataset.url) == (dataset.archive is None), dataset.url
        if dataset.archive is not None:
            assert re.fullmatch(r"[0-9a-f]{64}", dataset.archive_sha256)
        assert all(re.fullmatch(r"[0-9a-f]{64}", sha) for sha in dataset.files.values())


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"`name` must be one of \['conll2000_chunking', .*received 'imdb'"):
        fetch_data("imdb")
    with pytest.raises(ValueError, match=r"`files` must be some of \['rt-polarity.neg', 'rt-polarity.pos'\], "
                       r"received \['rt-polarity.txt'\]"):
        fetch_data("sentence_polarity", ["rt-polarity.txt"])
    with pytest.raises(TypeError, match="`files` must be a sequence of file names, received the string 'train.txt'"):
        fetch_data("conll2000_chunking", "train.txt")
