"""What the demo and the example scripts share (`arguments`: argument
checks, the epoch timer, tf.data options). Not imported by the layers.
`main`: the `keras-birnn` command (`data`, `evaluate`, `predict`, `export`)."""
