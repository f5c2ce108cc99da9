"""Training from a config file: `keras-birnn train CONFIG --run DIR`.

`config` (settings, their defaults and sources, TOML and `--set`),
`corpus` (the data settings to train and dev examples), `distributed`
(the processes of a data-parallel job, each one's rows), `checkpoint`
(atomic checkpoints of every variable), `trainer` (the epoch loop, dev
selection, early stopping, resume) and `report` (the epoch line,
history.csv, report.txt).
"""

from keras_birnn.training.config import ConfigError, resolve
from keras_birnn.training.distributed import ClusterError
from keras_birnn.training.trainer import RunError, train

__all__ = ["ClusterError", "ConfigError", "RunError", "resolve", "train"]
