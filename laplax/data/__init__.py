"""Data: TFDS builders for local files and loading (`builders`), grain pipelines (`pipeline`).

Import the submodules directly (`from laplax.data import builders, pipeline`): nothing is
re-exported here, so that importing one data module does not pull in TFDS and grain as well.
"""
