"""keras_birnn.cli.arguments: the argument checks and the epoch timer the demo and the examples share."""

import argparse

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_birnn.cli import arguments as cli
from keras_birnn.cli.arguments import EpochTimer, check_layers, finish_args, without_autotuning


def _parse(argv):
    parser = argparse.ArgumentParser(prog="example")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--variants", default="gru,bigru")
    args = parser.parse_args(argv)
    return finish_args(
        parser, args, quick=dict(epochs=(2, 8)), choices=("variants", ("gru", "bigru", "bilstm")),
        positive=("epochs", "batch_size"),
    )


def test_quick_defaults_and_comma_lists():
    full, quick = _parse([]), _parse(["--quick"])
    assert (full.epochs, quick.epochs) == (8, 2)
    assert _parse(["--quick", "--epochs", "5"]).epochs == 5  # an explicit value wins
    assert _parse(["--variants", " bilstm, gru ,"]).variants == ["bilstm", "gru"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variants", "gru,lstm"], "--variants: unknown ['lstm']; choose from gru,bigru,bilstm"),
        (["--variants", " , "], "--variants: unknown []; choose from gru,bigru,bilstm"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--batch-size", "-3"], "--batch-size must be at least 1"),
    ],
)
def test_bad_values_are_refused_naming_the_argument(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        _parse(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_layers_check_names_the_value():
    assert check_layers("kb") == "kb" and check_layers("keras") == "keras"
    with pytest.raises(ValueError, match=r"`layers` must be one of \('kb', 'keras'\), received 'torch'"):
        check_layers("torch")


class _Clock:
    """A stand-in for the `time` module that `keras_birnn.cli.arguments` reads:
    `perf_counter()` is `now`, which only `_Ticks` moves."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Ticks(keras.callbacks.Callback):
    """Moves the clock 1 s per training batch and 100 s per validation
    batch, so the timer's split between them is known exactly (no sleeps:
    the machine's load cannot move it)."""

    def __init__(self, clock: _Clock):
        super().__init__()
        self.clock = clock

    def on_train_batch_end(self, batch, logs=None):
        self.clock.now += 1.0

    def on_test_batch_end(self, batch, logs=None):
        self.clock.now += 100.0


def test_epoch_timer_splits_training_from_validation(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(cli, "time", clock)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.zeros((8, 3), "float32"), np.zeros((8, 1), "float32")
    timer = EpochTimer()
    model.fit(x, y, batch_size=4, epochs=2, validation_data=(x, y), callbacks=[_Ticks(clock), timer], verbose=0)
    model.evaluate(x, y, verbose=0, callbacks=[_Ticks(clock)])  # outside fit: not counted
    # Each epoch: 2 training batches, then a validation pass of 2 batches.
    assert timer.seconds == [2.0, 2.0] and timer.validation_seconds == [200.0, 200.0]
    plain = EpochTimer()
    model.fit(x, y, batch_size=4, epochs=3, callbacks=[_Ticks(clock), plain], verbose=0)
    assert plain.seconds == [2.0, 2.0, 2.0] and plain.validation_seconds == []


def test_without_autotuning_keeps_the_elements():
    data = tf.data.Dataset.range(5).batch(2)
    assert data.options().autotune.enabled is not False
    quiet = without_autotuning(data)
    assert quiet.options().autotune.enabled is False
    assert [b.numpy().tolist() for b in quiet] == [[0, 1], [2, 3], [4]]


def test_data_arguments_default_to_the_environment_then_a_download(tmp_path, monkeypatch):
    """No flag: None everywhere (fetch_data then reads KERAS_BIRNN_DATA);
    with --data-dir, a mirror of the registered files answers without network."""
    import hashlib

    from keras_birnn.data.downloads import DataSet

    parser = argparse.ArgumentParser(prog="example")
    cli.add_data_arguments(parser)
    args = parser.parse_args([])
    assert (args.data_dir, args.cache_dir, args.data_url) == (None, None, None)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "a.txt").write_bytes(b"a line\n")
    tiny = {"tiny": DataSet("tiny", {"a.txt": hashlib.sha256(b"a line\n").hexdigest()}, "http://127.0.0.1:9/{name}")}
    monkeypatch.setattr(cli.downloads, "DATASETS", tiny)
    monkeypatch.setenv("KERAS_BIRNN_DATA", str(tmp_path))
    assert cli.fetch_data_or_exit(parser, args, "tiny") == {"a.txt": str(tmp_path / "tiny" / "a.txt")}
    monkeypatch.delenv("KERAS_BIRNN_DATA")
    args = parser.parse_args(["--data-dir", str(tmp_path)])
    assert cli.fetch_data_or_exit(parser, args, "tiny", ["a.txt"]) == {"a.txt": str(tmp_path / "tiny" / "a.txt")}
