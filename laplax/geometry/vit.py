"""Per-layer token geometry of a trained ViT classifier, streamed over a data split.

Which tokens each metric uses (layer 0 = patch embedding + positions, layer l = output of block
l, before the final LayerNorm):
  * variance decomposition, within-sequence cosine: all 1 + N tokens of an image (the sequence);
  * spectrum pooled over images (`components_90/95/99`, `effective_rank`: one covariance of the
    N patch tokens of every image) and per image, the paper's quantity
    (`per_sequence_components_90/95/99`, `per_sequence_effective_rank`, each with `_std`: each
    image's own covariance of its N patch tokens, averaged over images; its rank is at most
    `per_sequence_rank_bound` = min(N - 1, E); laplax.geometry.spectra);
  * Neural Collapse on sequence means (`nc_mean_*`): the mean of all tokens of an image;
  * Neural Collapse on the class token (`nc_cls_*`);
  * NC3 / NC4 (`classifier_*`): the final, normalised class token against the linear head.
Statistics accumulate batch by batch, in float64 (compensated float32 on TPU, which emulates
float64: geometry.stats.device_dtype), so memory does not grow with the data (only the final
class tokens, (N, E), are kept for NC3 / NC4); streamed splits are read batch by batch
(`analyze_batches`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax import geometry
from laplax.geometry import spectra

_update = {cls: jax.jit(cls.update) for cls in (
    geometry.VarianceStats, geometry.CosineStats, geometry.CovarianceStats,
    geometry.NeuralCollapseStats)}
_finalize = {cls: jax.jit(cls.finalize) for cls in (
    geometry.VarianceStats, geometry.CosineStats, geometry.CovarianceStats)}
_finalize_nc = jax.jit(geometry.NeuralCollapseStats.finalize)
_update_per_image = jax.jit(spectra.SequenceSpectrumStats.update)
_finalize_per_image = jax.jit(spectra.SequenceSpectrumStats.finalize)


def _scalars(d: dict[str, Any], prefix: str = "", undefined: dict | None = None
             ) -> dict[str, float]:
  """The scalars of a finalize() dict as floats; NaN ones' reasons go into `undefined`."""
  d = dict(d)
  reasons = geometry.stats.undefined_reasons(d, prefix)
  if undefined is not None:
    undefined.update(reasons)
  return {prefix + k: float(v) for k, v in d.items() if np.ndim(v) == 0}


def layer_geometry(forward, params, batches: Iterable[dict[str, Any]], *, num_classes: int,
                   dtype=None) -> tuple[list[dict[str, float]], np.ndarray, np.ndarray]:
  """forward(params, images (B,H,W,C)) -> {'tokens': (L+1, B, 1+N, E), 'pre_logits': (B, E)};
  batches: {'image' normalised, 'label', 'mask'} (valid rows first); dtype: the sums' dtype,
  float64 or (compensated) float32, None: geometry.stats.device_dtype (float32 on TPU). ->
  (one dict per layer, pre_logits (n, E) and labels (n,) of the valid rows)."""
  dtype = geometry.stats.device_dtype() if dtype is None else np.dtype(dtype)
  accs, feats, ys = None, [], []
  for batch in batches:
    n = int(np.sum(batch["mask"]))
    out = forward(params, batch["image"])
    tokens = np.asarray(out["tokens"])[:, :n]  # float32, outside x64
    feats.append(np.asarray(out["pre_logits"])[:n])
    y = np.asarray(batch["label"][:n])
    ys.append(y)
    with geometry.stats.x64_for(dtype):
      depth, _, seq, dim = tokens.shape
      if accs is None:
        # float32 sums are shifted by the first batch's mean token: a common offset would
        # cancel their digits in E[x^2] - E[x]^2 (the metrics but the cosine are invariant)
        shifts = [t.reshape(-1, dim).mean(0) if dtype == np.float32 else None for t in tokens]
        accs = [dict(variance=geometry.VarianceStats.init(num_classes, dim, seq, dtype=dtype,
                                                          shift=sh),
                     cosine=geometry.CosineStats.init(dtype=dtype),
                     spectrum=geometry.CovarianceStats.init(dim, dtype=dtype, shift=sh),
                     nc_mean=geometry.NeuralCollapseStats.init(num_classes, dim, dtype=dtype,
                                                               shift=sh),
                     nc_cls=geometry.NeuralCollapseStats.init(num_classes, dim, dtype=dtype,
                                                              shift=sh),
                     per_image=spectra.SequenceSpectrumStats.init(dtype=dtype))
                for sh in shifts]
      for layer, acc in enumerate(accs):
        t = jnp.asarray(tokens[layer], dtype)
        acc["variance"] = _update[geometry.VarianceStats](acc["variance"], t, y)
        acc["cosine"] = _update[geometry.CosineStats](acc["cosine"], t)
        acc["spectrum"] = _update[geometry.CovarianceStats](acc["spectrum"], t[:, 1:])
        acc["nc_mean"] = _update[geometry.NeuralCollapseStats](acc["nc_mean"], t.mean(1), y)
        acc["nc_cls"] = _update[geometry.NeuralCollapseStats](acc["nc_cls"], t[:, 0], y)
        acc["per_image"] = _update_per_image(acc["per_image"], t[:, 1:])
  if accs is None:
    raise ValueError("no images to measure")
  out = []
  with jax.enable_x64(True):
    for acc in accs:
      acc = {name: geometry.stats.to_float64(a) for name, a in acc.items()}
      undefined: dict[str, str] = {}
      row = _scalars(_finalize[geometry.VarianceStats](acc["variance"]), "", undefined)
      row.update(_scalars(_finalize[geometry.CosineStats](acc["cosine"])))
      pooled = geometry.pooled_spectrum(_finalize[geometry.CovarianceStats](acc["spectrum"]))
      undefined.update(pooled.pop("undefined", {}))
      row.update(pooled)
      row.update(_scalars(_finalize_nc(acc["nc_mean"]), "nc_mean_", undefined))
      row.update(_scalars(_finalize_nc(acc["nc_cls"]), "nc_cls_", undefined))
      spectra.merge_rows(row, spectra.host_result(
          jax.device_get(_finalize_per_image(acc["per_image"])), seq - 1, dim))
      undefined.update(row.pop("undefined", {}))
      if undefined:  # which NaNs are 0 / 0, and why (skipped by plots and reports)
        row["undefined"] = undefined
      out.append(row)
  return out, np.concatenate(feats), np.concatenate(ys)


def analyze_batches(model, params, batches: Iterable[dict[str, Any]], *, num_classes: int
                    ) -> dict[str, Any]:
  """Every metric at every layer, plus NC3 / NC4 of the final class token against the head, of
  a stream of batches ({'image': normalised float32 (B, H, W, C), 'label', 'mask'}: a task's
  eval_batches): one forward pass per batch, memory bounded by the batch (plus the final
  class tokens, (N, E), for the classifier's NC3 / NC4)."""
  forward = jax.jit(lambda p, x: model.apply({"params": p}, x, return_tokens=True)[1])
  layers, feats, labels = layer_geometry(forward, params, batches, num_classes=num_classes)
  head = params["head"]
  final = geometry.neural_collapse(feats, labels, np.asarray(head["kernel"]).T,
                                   num_classes=num_classes, bias=np.asarray(head["bias"]))
  undefined: dict[str, str] = {}
  classifier = _scalars(final, "", undefined)
  if undefined:
    classifier["undefined"] = undefined
  return {"layers": layers, "classifier": classifier, "num_examples": int(len(labels))}
