"""Recurrent cells: one step of a recurrence, with Keras's weight layout."""

from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.gru import GRUCell, GRUMath
from keras_birnn.cells.lstm import LSTMCell, LSTMMath
from keras_birnn.cells.simple_rnn import SimpleRNNCell, SimpleRNNMath
