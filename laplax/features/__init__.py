"""Frozen-backbone features, below the geometry and the evaluators that read them: the feature
pass in memory (extract.py) and streamed over the mesh and hosts (stream.py), PCA of patch
features (pca.py) and mask scores (masks.py)."""
