"""The TensorFlow engine: `plan` decides how a call's loops are built,
`dispatch.run` executes the plan (with the hand-written BPTT as a custom
gradient), `compiled` caches the loops as plain or XLA-compiled functions,
`loops` and `timeloop` are the forward and BPTT `tf.while_loop`s,
`gradients` the sums over time, `layout` the flat tensor lists a call
travels in, `bucketing` the time buckets. Imported on TensorFlow only."""
