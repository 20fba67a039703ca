"""Laplacian attention: heads that return (I - P) V instead of P V.

Two modules, as MaxText splits attention_op.py from attentions.py:
  op.py      the operation. `laplacian_combine` (the paper's change: o = v - P V on the
             Laplacian heads, first in the file), `laplacian_attention` (every Laplacian head
             in laplax goes through it: the fused attention, the implementation switch, the
             generalised heads' recurrence, the controls' uniform means, the sliding windows,
             `operator_matrices` for analysis); its docstring is the whole story.
  module.py  the Flax layer `MultiHeadAttention` (projections, RoPE, QK-norm, KV cache, the
             'mix' and 'gate' heads' parameters), `rms_norm`, `apply_rope`, `gate_values`.

The names below are the package's API: `from laplax import attention` and
`from laplax.attention import X` keep working as they did for the single module.
"""

from laplax.attention.module import (ANALYSIS, GATE_STRETCH, GATE_TEMPERATURE,
                                     MultiHeadAttention, apply_rope, gate_values, rms_norm)
from laplax.attention.op import (IMPLEMENTATIONS, NO_WINDOW, Window, laplacian_attention,
                                 laplacian_combine, operator_matrices, query_positions,
                                 resolve_implementation, uniform_mean)

__all__ = [
    "ANALYSIS", "GATE_STRETCH", "GATE_TEMPERATURE", "IMPLEMENTATIONS", "MultiHeadAttention",
    "NO_WINDOW", "Window", "apply_rope", "gate_values", "laplacian_attention",
    "laplacian_combine", "operator_matrices", "query_positions", "resolve_implementation",
    "rms_norm", "uniform_mean",
]
