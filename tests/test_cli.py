"""keras_birnn.cli.finish_args: the argument checks the demo and the examples share."""

import argparse

import pytest

from keras_birnn.cli import finish_args


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
