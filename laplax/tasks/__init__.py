"""The tasks: classification.py, lm.py, dino.py, each a `laplax.train.task.Task` subclass.

The registry config.task -> class (and the interface) is `laplax.train.task`.
"""
