"""Helpers every stage shares: dtypes and their widening ladder, atomic I/O, data, Keras, timing.

Nothing here imports a stage of autoprec; every stage may import from here.
"""
