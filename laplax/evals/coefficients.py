"""The learned coefficients of 'mix' heads (laplax.heads): a_h V + b_h P V, per layer and head.

Evaluator type 'head_coefficients': reads the parameters only (no data), so it costs nothing and
can run at every checkpoint step, giving the picture of which heads turn Laplacian-like (b < 0:
they subtract the neighbourhood average) and how early. Rows: 'a_L{layer}_H{head}',
'b_L{layer}_H{head}' for every mix head; nothing for a model without mix heads.
"""

from __future__ import annotations

from typing import Any

from laplax import heads as heads_lib
from laplax.train import export as export_lib
from laplax.train.evaluator import Evaluator


def coefficient_metrics(params, table: heads_lib.Table) -> dict[str, float]:
  """{'a_L0_H1': a, 'b_L0_H1': b, ...} of the mix heads of `table` as `params` hold them."""
  rows = export_lib.coefficient_rows(params, len(table))
  out: dict[str, float] = {}
  if rows is None:
    return out
  for i, row in enumerate(table):
    for h, op in enumerate(row):
      if op.learned:
        out[f"a_L{i}_H{h}"] = float(rows[0][i][h])
        out[f"b_L{i}_H{h}"] = float(rows[1][i][h])
  return out


def parse_key(key: str) -> tuple[str, int, int] | None:
  """'b_L2_H0' -> ('b', 2, 0); None for any other key."""
  parts = key.split("_")
  if len(parts) != 3 or parts[0] not in ("a", "b") or parts[1][:1] != "L" or parts[2][:1] != "H":
    return None
  return parts[0], int(parts[1][1:]), int(parts[2][1:])


class HeadCoefficients(Evaluator):
  type = "head_coefficients"

  def run(self, weights, step: int | None) -> dict[str, Any]:
    model = self.ctx.model
    table = heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
    return coefficient_metrics(weights.params, table)

  def summary(self, result: dict[str, Any]) -> str:
    b = [v for k, v in result.items() if k.startswith("b_")]
    if not b:
      return f"{self.name}: no mix heads"
    return (f"{self.name}: {sum(x < 0 for x in b)}/{len(b)} mix heads Laplacian-like (b < 0), "
            f"b in [{min(b):.3f}, {max(b):.3f}]")
