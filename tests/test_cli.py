"""keras_birnn.cli: the argument checks and the epoch timer the demo and the examples share."""

import argparse
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_birnn.cli import EpochTimer, check_layers, finish_args, without_autotuning


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


class _Slow(keras.callbacks.Callback):
    """Sleeps in training batches and in validation batches, so the timer's
    split between them is known."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)

    def on_test_batch_end(self, batch, logs=None):
        time.sleep(0.5)


def test_epoch_timer_splits_training_from_validation():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.zeros((8, 3), "float32"), np.zeros((8, 1), "float32")
    timer = EpochTimer()
    model.fit(x, y, batch_size=4, epochs=2, validation_data=(x, y), callbacks=[_Slow(), timer], verbose=0)
    model.evaluate(x, y, verbose=0)  # outside fit: not counted
    assert len(timer.seconds) == 2 and len(timer.validation_seconds) == 2
    # 2 training batches x 0.02 s; with the validation pass it would be >= 1 s.
    assert all(0.04 <= t < 0.9 for t in timer.seconds[1:])
    assert all(t >= 1.0 for t in timer.validation_seconds)  # 2 validation batches x 0.5 s
    plain = EpochTimer()
    model.fit(x, y, batch_size=4, epochs=3, callbacks=[_Slow(), plain], verbose=0)
    assert len(plain.seconds) == 3 and plain.validation_seconds == []


def test_without_autotuning_keeps_the_elements():
    data = tf.data.Dataset.range(5).batch(2)
    assert data.options().autotune.enabled is not False
    quiet = without_autotuning(data)
    assert quiet.options().autotune.enabled is False
    assert [b.numpy().tolist() for b in quiet] == [[0, 1], [2, 3], [4]]
