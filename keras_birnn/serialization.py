"""Configs of the layers: one home for how nested objects are saved and loaded.

Keras 3's convention, kept by every layer here: constructors take objects,
`get_config` serialises them, and `from_config` is the only place that
deserialises nested layers and cells (`deserialized`). A config handed to a
constructor is refused with a message saying where it belongs
(`refuse_config`).
"""

from typing import Any, Dict

import keras


def refuse_config(value: Any, argument: str, owner: str) -> None:
    """A constructor takes objects; a config (a dict) is deserialised by
    the layer's `from_config`, the one place that loads nested layers."""
    if isinstance(value, dict):
        raise TypeError(
            f"`{argument}` of {owner} must be an object, received a config (a dict): build the layer "
            f"with {owner}.from_config(config), or deserialize the argument first with "
            "keras.saving.deserialize_keras_object."
        )


def deserialized(config: dict, *names: str) -> dict:
    """A copy of `config` whose entries `names` that hold a config (a dict)
    are deserialised objects; other values (None, a cell name) stay."""
    config = dict(config)
    for name in names:
        if isinstance(config.get(name), dict):
            config[name] = keras.saving.deserialize_keras_object(config[name])
    return config


def initializer_configs(layer: Any, *names: str) -> Dict[str, Any]:
    """`{name: serialized layer.name}` for initializer arguments."""
    return {name: keras.initializers.serialize(getattr(layer, name)) for name in names}


def attributes(layer: Any, *names: str) -> Dict[str, Any]:
    """`{name: layer.name}` for plain (JSON-ready) constructor arguments
    that the layer keeps under the same name."""
    return {name: getattr(layer, name) for name in names}
