"""The mechanism evaluator: per head and layer, what the heads do (laplax.geometry.mechanism).

  evals.mechanism = {'type': 'mechanism', 'at_init': True, 'examples': 500}

For a ViT classifier, a DINO run's teacher backbone or a GPT: the eigenvalues of each head's
W_O_h W_V_h (weights only), and on the first `examples` images of `split` (an LM: validation
windows) each head's mean-vs-deviation share, the graph energy of the layer's input on the
matrix the head applies (P; U or I for the controls) and that matrix's entropy. `at_init` +
`final` give "before and after training" (init_eval.json and results.json). Writes analysis/mechanism_step{step}.json and .png ->
{'layers': [one row per layer: layer means, and per head '..._heads'], 'weights': {...},
'head_kinds', 'head_operators' (each head's a, b, steps and matrix), 'num_sequences'}.
"""
from __future__ import annotations

import json
from typing import Any

import jax

from laplax import sections
from laplax.attention import ANALYSIS
from laplax.geometry import mechanism
from laplax.geometry import plots
from laplax.train import analysis
from laplax.train import ranges as ranges_lib
from laplax.train import task as task_lib
from laplax.train.evaluator import Evaluator

_SPLITS = ("val", "test")


_FORWARD: dict[str, Any] = {}  # one compiled forward per model (study cells share theirs)


def forward_fn(subj: analysis.AnalysedModel):
  """-> jitted f(params, x, valid) -> mechanism.batch_sums of one batch (x: normalised images
  (B, H, W, C) for a ViT, int tokens (B, T) for a GPT); the same function for equal models."""
  key = f"{subj.kind}:{subj.module!r}"
  if key not in _FORWARD:
    _FORWARD[key] = _make_forward(subj)
  return _FORWARD[key]


def _make_forward(subj: analysis.AnalysedModel):
  module, depth = subj.module, subj.depth

  @jax.jit
  def f(params, x, valid):
    if subj.kind == "vit":
      (_, out), col = module.apply({"params": params}, x, return_tokens=True,
                                   mutable=[ANALYSIS])
      stream = out["tokens"]
    else:
      (_, out), col = module.apply({"params": params}, x, return_hidden=True,
                                   mutable=[ANALYSIS])
      stream = out["hidden"]
    a = mechanism.collect(col, depth)
    return mechanism.batch_sums(stream[:-1], a["probs"], a["head_outputs"], valid)

  return f


def measure(subj: analysis.AnalysedModel, batches, forward=None) -> dict[str, Any]:
  """The weights' and the data's measurements of `subj` over (x, valid) batches."""
  forward = forward or forward_fn(subj)
  kinds = [[op.kind for op in row] for row in subj.head_table]
  weights = mechanism.value_output_spectra(subj.params, subj.depth, subj.num_heads, kinds)
  acc, params = mechanism.MechanismStats(), None
  for x, valid in batches:
    if params is None:
      params = subj.params_at(x.shape[1:3]) if subj.kind == "vit" else subj.params
    acc.add(forward(params, x, valid))
  out = acc.finalize()
  for row, w in zip(out["layers"], weights["layers"]):
    for key in ("negative_real_fraction", "signed_trace_ratio", "spectral_radius"):
      row[key], row[key + "_heads"] = w["mean_" + key], w[key]
    row["eigenvalues_real"], row["eigenvalues_imag"] = w["eigenvalues_real"], w["eigenvalues_imag"]
  out["weights"] = {k: v for k, v in weights.items() if k != "layers"}
  out["head_kinds"] = kinds
  out["head_operators"] = mechanism.head_operators(subj.head_table, subj.params)
  return out


class Mechanism(Evaluator):
  """Module docstring. Keys: split ('val' / 'test'; images), examples, batch_size."""

  type = "mechanism"
  reads = task_lib.Subject
  defaults = {"split": "test", "examples": 500, "batch_size": 50}
  ranges = {"examples": ranges_lib.AT_LEAST_ONE, "batch_size": ranges_lib.AT_LEAST_ONE}

  @classmethod
  def check(cls, config, task) -> None:
    if config.split not in _SPLITS:
      raise ValueError(f"split={config.split!r}; use one of {_SPLITS}")

  def run(self, weights, step) -> dict[str, Any]:
    task, c = self.ctx.task, self.config
    subj = task.analysis_model(self.ctx.model, weights)
    batches = task.analysis_batches(c.split, c.examples, c.batch_size)
    out = measure(subj, batches)
    adir = self.ctx.out / "analysis"
    adir.mkdir(parents=True, exist_ok=True)
    tag = f"step{step}" if step is not None else "export"
    (adir / f"mechanism_{tag}.json").write_text(json.dumps(out, indent=2))
    name = sections.run_name(task.config)
    plots.plot_layer_curves({f"{name} ({tag})": [out]}, adir / f"mechanism_{tag}.png",
                            "mechanism")
    return out

  def summary(self, result) -> str:
    last = result["layers"][-1]
    return (f"{self.name}: last layer graph energy "
            f"{last['graph_energy']:.3f}, entropy {last['attention_entropy']:.3f}, "
            f"mean share {last['mean_share']:.3f}; W_O W_V negative real share "
            f"{result['weights']['negative_real_fraction']:.3f}")
