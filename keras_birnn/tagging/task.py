"""What the task models share: a `keras.Model` over strings that holds its
encoder (strings to ids) and its network, saved as one `.keras` file."""

from __future__ import annotations

from typing import Optional

import keras
import numpy as np

from keras_birnn.tagging.batching import DEFAULT_BATCH_SIZE, EncodedSentences, drop_words, sentence_dataset
from keras_birnn.tf_internal import flatten_layers, force_jit_compile


class StringTaskModel(keras.Model):
    """The `.keras` side of `Tagger` and `SentenceClassifier`: the encoder
    and the network serialize as nested objects, the names beside them
    (`names_config`); `from_config` rebuilds the nested objects first."""

    def names_config(self) -> dict:
        """The subclass's own constructor arguments (its tag or label names)."""
        return {}

    def get_config(self) -> dict:
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "network": keras.saving.serialize_keras_object(self.network),
        }
        config.update(self.names_config())
        return config

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        config["network"] = keras.saving.deserialize_keras_object(config["network"])
        return cls(**config)

    def compile(self, optimizer="adam", loss=None, metrics=None, jit_compile="auto", **kwargs) -> None:
        """Keras's `compile`. `jit_compile` (True or "auto") looks at the
        network alone: the steps call the network only, the encoder's string
        ops run before them, on NumPy batches. (Keras's own check sees the
        encoder, which XLA cannot compile, and would train on JAX without
        `jax.jit`, many times slower.)"""
        wanted = jit_compile
        # Keras's setter refuses True here (it checks every tracked layer, the encoder included).
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics,
                        jit_compile="auto" if wanted is True else wanted, **kwargs)
        if wanted in ("auto", True) and keras.backend.backend() == "jax" and not kwargs.get("run_eagerly"):
            layers = [self.network] + flatten_layers(self.network)
            force_jit_compile(self, all(layer.supports_jit for layer in layers))

    def compile_from_config(self, config: dict) -> None:
        """Compiles a loaded model as it was saved (`compile` is overridden)."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if getattr(self, "optimizer", None) is not None:
            self.optimizer.build(self.trainable_variables)  # so its saved state loads

    # Subclasses say which inputs are theirs, how they become ids and how ids become batches.
    def takes_strings(self, x) -> bool:
        """Whether `x` is this model's string input (else Keras's own)."""
        raise NotImplementedError

    def encode(self, x, y=None) -> EncodedSentences:
        """Strings `x` (and their names `y`, as label ids) encoded once."""
        raise NotImplementedError

    def training_batch(self, encoded: EncodedSentences, indices, rng, word_dropout: float = 0.0) -> tuple:
        """The `fit` batch of some encoded items: `(inputs, labels[, weights])`,
        word dropout drawn with `rng` (None: none)."""
        raise NotImplementedError

    def strings_dataset(self, x, y, batch_size: int = DEFAULT_BATCH_SIZE, word_dropout: float = 0.0,
                        shuffle: bool = True, seed: Optional[int] = None):
        """Strings `x` and their names `y` as a `tf.data.Dataset` in model-input form.

        Args:
            x: The model's strings (token lists or texts).
            y: Their tags or labels (each one the model knows).
            batch_size: Items per batch (batches of similar lengths).
            word_dropout: Probability that a known word becomes OOV (drawn
                anew at each pass; only with `shuffle`).
            shuffle: Jitter, shuffle and drop words (training).
            seed: Seed of those draws.

        Returns:
            A length-bucketed dataset of `training_batch`'s form.
        """
        encoded = self.encode(x, y)
        drop_words(np.zeros(1), word_dropout, None)  # checks the rate
        return sentence_dataset(encoded, lambda e, i, rng: self.training_batch(e, i, rng, word_dropout),
                                batch_size, seed=seed, shuffle=shuffle)

    def fit(self, x=None, y=None, batch_size: Optional[int] = None, epochs: int = 1, *,
            word_dropout: float = 0.0, validation_data=None, seed: Optional[int] = None, **kwargs):
        """Trains on strings `x` and their names `y` (or on Keras's own inputs).

        Compiles with `compile()`'s defaults first if not compiled.

        Args:
            x: Strings (the subclass's form: token lists or texts), or
                anything Keras's `fit` takes (a `tf.data.Dataset` keeps its order).
            y: Their tags or labels, as strings.
            batch_size: Items per batch (default 32).
            epochs: Passes over the data.
            word_dropout: With strings: the probability that a known word id
                becomes OOV in training.
            validation_data: `(strings, names)` or Keras's.
            seed: With strings: seed of the batches' jitter, shuffle and
                word dropout.
            **kwargs: Keras's `fit` arguments (`callbacks`, `verbose`...).

        Returns:
            Keras's `History`.
        """
        if not self.compiled:
            self.compile()
        if hasattr(x, "element_spec"):  # a tf.data.Dataset: its order is its own
            kwargs.setdefault("shuffle", False)
        if not self.takes_strings(x):
            return super().fit(x, y, batch_size=batch_size, epochs=epochs, validation_data=validation_data, **kwargs)
        batch_size = batch_size or DEFAULT_BATCH_SIZE
        data = self.strings_dataset(x, y, batch_size, word_dropout, shuffle=True, seed=seed)
        if validation_data is not None and self.takes_strings(validation_data[0]):
            validation_data = self.strings_dataset(*validation_data, batch_size=batch_size, shuffle=False)
        kwargs["shuffle"] = False  # the dataset shuffles its batches itself
        return super().fit(data, epochs=epochs, validation_data=validation_data, **kwargs)
