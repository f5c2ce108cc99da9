"""The Keras layers: `kb.Recurrent` (one direction), `kb.Bidirectional`
(the only place directions merge), stacking (`kb.stacked_bidirectional`),
`kb.NestedEncoder`, the pooling heads, conversion from and to Keras's
`Bidirectional`, and `loop_report()` (`reporting`). Exported as `kb.*`."""
