"""laplax: Laplacian attention heads ((I - P)V instead of PV) in JAX/Flax.

The Laplacian change itself lives in `laplax.attention.laplacian_attention`.
"""
