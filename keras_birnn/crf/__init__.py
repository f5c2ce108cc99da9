"""The linear-chain CRF head: `kb.CRF`, `kb.CRFLoss` and their maths.

- `keras_birnn.crf.maths`: the chain's maths as pure functions (forward and
  backward scores, log partition, path score, NLL, Viterbi, marginals).
- `keras_birnn.crf.decoding`: n-best Viterbi and path log-probabilities.
- `keras_birnn.crf.schemes`: tagging schemes as transition constraints.
- `keras_birnn.crf.layer`: the `kb.CRF` layer; `keras_birnn.crf.loss`: `kb.CRFLoss`.
"""

from keras_birnn.crf.decoding import path_log_probability, viterbi_top_k
from keras_birnn.crf.layer import ALLOWED_TRANSITIONS, CRF
from keras_birnn.crf.loss import CRFLoss
from keras_birnn.crf.maths import (
    FORBIDDEN,
    PAD_TAG,
    backward_scores,
    forward_scores,
    log_partition,
    marginals,
    negative_log_likelihood,
    path_score,
    viterbi_decode,
)
from keras_birnn.crf.schemes import iob2_allowed, scheme_allowed

__all__ = [
    "ALLOWED_TRANSITIONS",
    "CRF",
    "CRFLoss",
    "FORBIDDEN",
    "PAD_TAG",
    "backward_scores",
    "forward_scores",
    "iob2_allowed",
    "log_partition",
    "marginals",
    "negative_log_likelihood",
    "path_log_probability",
    "path_score",
    "scheme_allowed",
    "viterbi_decode",
    "viterbi_top_k",
]
