"""Data: TFDS builders for local files (`datasets`, one module per data set), loading by name
(`builders`), the image pipeline for in-memory and streamed data (`streaming`; `arrays`:
normalisation), the token pipelines (`text`).

Import the submodules directly (`from laplax.data import builders, streaming`): nothing is
re-exported here, so that importing one data module does not pull in TFDS and grain as well.
"""
