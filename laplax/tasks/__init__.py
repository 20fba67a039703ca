"""The tasks, each a `laplax.train.task.Task` subclass: classification.py and dino.py (image
tasks: images.py's ImageTask owns their data, laplax.data.image_data, and their evaluation and
analysis interfaces), lm.py and chat.py (text).

The registry config.task -> class (and the interface) is `laplax.train.task`.
"""
