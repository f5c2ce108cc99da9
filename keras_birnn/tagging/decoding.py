"""`Decoder`: a tagger network's tag ids and their confidence, as a model Keras compiles.

`Tagger.predict` (and so `evaluate` and the trainer's dev pass) runs its
batches through `Decoder.predict_on_batch`: `jax.jit` on JAX, a
`tf.function` on TensorFlow. Run eagerly instead, JAX compiles every
operation anew for each new batch shape, which made a dev pass of a few
thousand sentences take minutes. Batches come padded to a multiple of
`LENGTH_MULTIPLE` tokens, so that few shapes are compiled; padding changes
no valid position's answer.
"""

from __future__ import annotations

from typing import Dict, Optional

import keras
from keras import ops

from keras_birnn.tagging.encoder import PAD_ID


def valid_positions(inputs):
    """True at the tokens of model inputs (words first), False at padding."""
    words = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
    return ops.not_equal(ops.convert_to_tensor(words), PAD_ID)


class Decoder(keras.Model):
    """Tag ids (-1 at padding) and their confidence (0 at padding) of a batch.

    Confidence is the CRF's marginal probability of the Viterbi tag, or the
    softmax probability of the argmax tag. Shares every weight with the
    network it reads; never saved (the tagger is).

    Args:
        scorer: The network with, for a CRF head, its emissions as a
            second output (the CRF's input).
        crf: The network's `kb.CRF` layer, or None (softmax head).
        **kwargs: `keras.Model` arguments (`name`).
    """

    def __init__(self, scorer: keras.Model, crf: Optional[keras.layers.Layer], **kwargs):
        super().__init__(**kwargs)
        self.scorer, self.crf = scorer, crf
        self.built = True

    def call(self, inputs) -> Dict[str, object]:
        valid = valid_positions(inputs)
        outputs = keras.tree.flatten(self.scorer(inputs, training=False))
        if self.crf is not None:  # the CRF's input is [emissions, mask]: flattened, the emissions come second
            ids, probabilities = outputs[0], self.crf.marginals(outputs[1], mask=valid)
        else:
            probabilities = outputs[0]
            ids = ops.argmax(probabilities, axis=-1)
        ids = ops.where(valid, ops.cast(ids, "int32"), 0)
        chosen = ops.take_along_axis(probabilities, ops.expand_dims(ids, -1), axis=-1)[..., 0]
        return {"tag_ids": ops.where(valid, ids, -1), "confidence": ops.where(valid, chosen, 0.0)}
