"""Export decorator: names a public symbol and registers it for `.keras` loading."""

from typing import Callable, TypeVar

import keras

PACKAGE = "keras_birnn"

T = TypeVar("T")


def keras_birnn_export(path: str) -> Callable[[T], T]:
    """Marks `symbol` as public API under `path` and registers it with Keras.

    Registration under the package name means a saved `.keras` file refers to
    `keras_birnn>ClassName`, so `keras.saving.load_model` finds the class
    without `custom_objects`, also with `safe_mode=True`.

    Args:
        path: The public dotted path, e.g. `"keras_birnn.GRUCell"`.
    """

    def decorator(symbol: T) -> T:
        name = path.rsplit(".", 1)[-1]
        registered = keras.saving.register_keras_serializable(
            package=PACKAGE, name=name
        )(symbol)
        registered._keras_birnn_export_path = path
        return registered

    return decorator
