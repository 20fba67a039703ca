"""Data: TFDS builders for local files (`datasets`, one module per data set), loading by name
(`builders`), grain pipelines (`pipeline`).

Import the submodules directly (`from laplax.data import builders, pipeline`): nothing is
re-exported here, so that importing one data module does not pull in TFDS and grain as well.
"""
