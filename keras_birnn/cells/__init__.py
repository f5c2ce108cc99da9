"""Recurrent cells: one step of a recurrence, with Keras's weight layout."""

from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.gru import GRUCell, gru_step
from keras_birnn.cells.lstm import LSTMCell, lstm_step
from keras_birnn.cells.simple_rnn import SimpleRNNCell, simple_rnn_step
