"""Helpers every stage shares: dtypes and their widening ladder, atomic I/O, data, Keras, timing."""
