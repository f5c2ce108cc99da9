"""Recurrent cells: one step of a recurrence, with Keras's weight layout."""

from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.gru import GRUCell, GRUMath, gru_step
from keras_birnn.cells.lstm import LSTMCell, LSTMMath, lstm_step
from keras_birnn.cells.simple_rnn import SimpleRNNCell, SimpleRNNMath, simple_rnn_step
