"""Exports, TensorFlow only: `saved_model` (`kb.export_saved_model`, TF
Serving's version folders, op checks), `litert` (`kb.export_tflite`, builtin
ops only) and `signatures`, the serving signature both build on (inputs,
lengths, the padding marker, named outputs)."""
