"""Sequence tagging from strings to a served tagger: a string encoder layer,
a BiLSTM-CRF builder, an export helper, vectors, spans and metrics.

Import the modules by their full path (`keras_birnn.tagging.encoder`, ...).
"""
