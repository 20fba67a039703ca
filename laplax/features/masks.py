"""Scores of predicted class maps against reference masks (segmentation probes, PCA masks)."""
from __future__ import annotations

import numpy as np


def segmentation_scores(pred: np.ndarray, target: np.ndarray, num_classes: int,
                        ignore_index: int | None = None) -> dict[str, float]:
  """Scores class maps pred (N, H, W) against target (N, H, W), pooled over all pixels.

  ignore_index: pixels whose TARGET is that label are left out, and so is that class from the
  mean IoU (ADE20K: 0 = unlabelled, mIoU over the 150 classes).

  Returns:
    fg_iou: IoU of the foreground (every class != 0) against the background (class 0).
    miou: mean over classes of the per-class IoU; a class absent from both pred and target
      has no IoU and is left out of the mean.
    pixel_acc: fraction of pixels labelled correctly.
  Intersections and unions are summed over the whole set before dividing (not per image).
  """
  pred, target = np.asarray(pred).astype(np.int64), np.asarray(target).astype(np.int64)
  if pred.shape != target.shape or pred.ndim != 3:
    raise ValueError(f"pred {pred.shape} and target {target.shape} must both be (N, H, W); "
                     "upsample predictions first (predict_masks)")
  for name, labels in (("pred", pred), ("target", target)):
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
      raise ValueError(f"{name} holds labels in [{labels.min()}, {labels.max()}] but "
                       f"num_classes={num_classes}")
  if ignore_index is not None:
    valid = target != ignore_index
    pred, target = pred[valid], target[valid]
  confusion = np.bincount((target * num_classes + pred).ravel(),
                          minlength=num_classes**2).reshape(num_classes, num_classes)
  true_positive = np.diag(confusion)
  union = confusion.sum(0) + confusion.sum(1) - true_positive
  present = union > 0
  if ignore_index is not None:
    present[ignore_index] = False
  fg_pred, fg_target = pred != 0, target != 0
  fg_union = np.logical_or(fg_pred, fg_target).sum()
  return {
      "fg_iou": float(np.logical_and(fg_pred, fg_target).sum() / fg_union)
                if fg_union else float("nan"),
      "miou": float(np.mean(true_positive[present] / union[present])),
      "pixel_acc": float(true_positive.sum() / max(confusion.sum(), 1)),
  }
