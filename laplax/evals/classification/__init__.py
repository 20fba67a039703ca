"""Image classification's evaluators (evaluators.py: accuracy, vit_geometry)."""
