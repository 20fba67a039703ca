"""Per-layer geometry plots (matplotlib, Agg): one curve per model variant, mean +- std bands;
attention maps."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath
import numpy as np

# figure name -> (title, [(metric key, panel title)])
FIGURES = {
    "variance": ("Variance decomposition (all tokens)", [
        ("within_sequence", "within-sequence fraction"),
        ("between_sequence", "between-sequence (within class) fraction"),
        ("between_class", "between-class fraction")]),
    "collapse": ("Neural Collapse", [
        ("nc_mean_nc1", "NC1 of sequence means (log)"),
        ("nc_cls_nc1", "NC1 of class token (log)"),
        ("nc_mean_etf_distance", "ETF distance of sequence means")]),
    "smoothing": ("Smoothing and spectral decay (patch tokens)", [
        ("within_sequence_cosine", "within-sequence cosine"),
        ("components_99", "components for 99 % variance"),
        ("effective_rank", "effective rank")]),
}
LOG_SCALE = {"nc_mean_nc1", "nc_cls_nc1"}
# Figures of other analyses (not of laplax.geometry.vit's rows: plot_run leaves them out).
OTHER_FIGURES = {
    "per_sequence": ("Spectral decay: per sequence (the paper's) vs pooled over sequences", [
        ("per_sequence_components_99", "components for 99 %, per sequence (mean)"),
        ("components_99", "components for 99 %, pooled"),
        ("per_sequence_effective_rank", "effective rank, per sequence (mean)")]),
    "mechanism": ("Mechanism per block (mean over heads)", [
        ("graph_energy", "graph energy E(X, M) / V(X)"),
        ("attention_entropy", "attention entropy (nats)"),
        ("mean_share", "output share moving the sequence mean"),
        ("negative_real_fraction", "W_O W_V: eigenvalues with Re < 0")]),
}
XLABEL = {"mechanism": "block"}


def _pyplot():
  """matplotlib.pyplot on the Agg backend, imported at the first figure: every train.py and
  eval.py process imports this module (through the evaluators), most draw nothing, and pyplot's
  import is about 0.25 s of CPU."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save_figure(fig, path, **kwargs) -> None:
  """fig as a PNG at `path`, local or gs:// (written through etils.epath)."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with path.open("wb") as f:
    fig.savefig(f, format="png", **kwargs)


def plot_layer_curves(groups: Mapping[str, Sequence[dict[str, Any]]], path: pathlib.Path,
                      figure: str) -> pathlib.Path:
  """groups: label -> analyses (each {'layers': [{metric: value}, ...]}); one PNG per figure
  (FIGURES or OTHER_FIGURES)."""
  title, panels = FIGURES[figure] if figure in FIGURES else OTHER_FIGURES[figure]
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6))
  for ax, (key, panel_title) in zip(np.atleast_1d(axes), panels):
    for label, runs in groups.items():
      values = np.array([[layer[key] for layer in run["layers"]] for run in runs], float)
      x = np.arange(values.shape[1])
      mean, std = values.mean(0), values.std(0)
      ax.plot(x, mean, marker="o", ms=3, label=f"{label} (n={len(runs)})")
      if len(runs) > 1:
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    if key in LOG_SCALE:
      ax.set_yscale("log")
    ax.set_title(panel_title, fontsize=10)
    ax.set_xticks(np.arange(len(next(iter(groups.values()))[0]["layers"])))
    ax.set_xlabel(XLABEL.get(figure, "layer (0 = embedding)"))
    ax.grid(alpha=0.3)
  np.atleast_1d(axes)[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  save_figure(fig, path, dpi=110)
  plt.close(fig)
  return path


def plot_run(analysis: dict[str, Any], outdir: pathlib.Path, title: str = "run"
             ) -> list[pathlib.Path]:
  """Every figure for one analysed run."""
  return [plot_layer_curves({title: [analysis]}, pathlib.Path(outdir) / f"{name}.png", name)
          for name in FIGURES]


def plot_accuracy(labels: Sequence[str], accuracies: Sequence[Sequence[float]],
                  path: pathlib.Path) -> pathlib.Path:
  """Test accuracy per variant: every seed as a dot, mean +- std as a bar."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(labels), 3.4))
  for i, accs in enumerate(accuracies):
    accs = np.asarray(accs, float) * 100
    ax.bar(i, accs.mean(), yerr=accs.std(ddof=1) if len(accs) > 1 else 0, alpha=0.4,
           capsize=4)
    ax.scatter(np.full(len(accs), i), accs, color="k", s=12, zorder=3)
  ax.set_xticks(range(len(labels)), labels)
  lo = min(np.min(a) for a in accuracies) * 100
  ax.set_ylim(max(lo - 3, 0), None)
  ax.set_ylabel("test accuracy (%)")
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)
  plt.close(fig)
  return path


def plot_spectrum(analyses: dict[str, dict[str, Any]], path, title: str = "Spectral decay"):
  """Components for 99 % variance (pooled over sequences, and per sequence when measured) and
  effective rank per layer; one curve per label."""
  keys = [("components_99", "components for 99 % variance, pooled"),
          ("effective_rank", "effective rank, pooled")]
  first = next(iter(analyses.values()))
  first = first[0] if isinstance(first, list) else first
  if "per_sequence_components_99" in first["layers"][0]:
    keys.insert(1, ("per_sequence_components_99", "components for 99 %, per sequence (mean)"))
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.6))
  for ax, (key, panel) in zip(axes, keys):
    for label, runs in analyses.items():
      runs = runs if isinstance(runs, list) else [runs]
      values = np.array([[l[key] for l in r["layers"]] for r in runs], float)
      x = np.arange(values.shape[1])
      ax.plot(x, values.mean(0), marker="o", ms=3, label=f"{label} (n={len(runs)})")
      if len(runs) > 1:
        ax.fill_between(x, values.mean(0) - values.std(0), values.mean(0) + values.std(0),
                        alpha=0.2)
    ax.set_xticks(np.arange(values.shape[1]))
    ax.set_title(panel, fontsize=10)
    ax.set_xlabel("layer (0 = embedding)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  return _save(fig, path)


def _save(fig, path, dpi: int = 110) -> pathlib.Path:
  """Lays out, writes (making the folder) and closes a figure -> its path."""
  fig.tight_layout()
  save_figure(fig, path, dpi=dpi)  # local or gs://
  plt = _pyplot()
  plt.close(fig)
  return path


# What each kind of head does with the P-weighted values (attention maps' titles).
_VERB = {"attention": "adds", "laplacian": "subtracts"}


def plot_attention_maps(images: np.ndarray,
                        maps: Mapping[str, tuple[np.ndarray, Sequence[str]]], path: pathlib.Path,
                        *, row_labels: Sequence[str] | None = None) -> pathlib.Path:
  """One PNG: rows = images (uint8 (N, H, W, C)), then for each run {name: (maps (N, heads, h,
  w), head kinds)} its heads side by side, each panel on its own scale."""
  n = len(images)
  cols = 1 + sum(m.shape[1] for m, _ in maps.values())
  plt = _pyplot()
  fig, axes = plt.subplots(n, cols, figsize=(1.5 * cols, 1.55 * n + 0.5), squeeze=False)
  grey = images.shape[-1] == 1
  for i in range(n):
    ax = axes[i, 0]
    ax.imshow(images[i, ..., 0] if grey else images[i], cmap="gray" if grey else None)
    ax.set_ylabel(row_labels[i] if row_labels is not None else f"image {i}", fontsize=7)
    j = 1
    for name, (m, kinds) in maps.items():
      for h in range(m.shape[1]):
        ax = axes[i, j]
        ax.imshow(m[i, h], cmap="inferno", interpolation="nearest")
        if i == 0:
          verb = _VERB.get(kinds[h], kinds[h])
          ax.set_title(f"{name}\nhead {h}: {verb} P", fontsize=7)
        j += 1
  for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
  fig.suptitle("Last block: class-token attention P per head (an ordinary head adds the "
               "P-weighted values, a Laplacian head subtracts them)", fontsize=8)
  return _save(fig, path)


def plot_learning_curve(steps: Sequence[int], accuracies: Mapping[str, Sequence[Sequence[float]]],
                        differences: Mapping[str, Sequence[tuple[float, float, float]]],
                        path: pathlib.Path) -> pathlib.Path:
  """Left: test accuracy vs step per variant (mean, +- std band over seeds); right: the paired
  difference vs the baseline with its 95 % interval (nan intervals drawn as points only)."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
  for label, per_step in accuracies.items():
    a = np.asarray(per_step, float) * 100  # (steps, seeds)
    axes[0].plot(steps, a.mean(1), marker="o", ms=3, label=label)
    if a.shape[1] > 1:
      axes[0].fill_between(steps, a.mean(1) - a.std(1, ddof=1), a.mean(1) + a.std(1, ddof=1),
                           alpha=0.2)
  axes[0].set_title("test accuracy (%)", fontsize=10)
  axes[0].legend(fontsize=8)
  for label, diffs in differences.items():
    d = np.asarray(diffs, float) * 100  # (steps, 3): mean, low, high
    axes[1].plot(steps, d[:, 0], marker="o", ms=3, label=f"{label} - baseline")
    if np.isfinite(d[:, 1]).all():
      axes[1].fill_between(steps, d[:, 1], d[:, 2], alpha=0.2)
  axes[1].axhline(0.0, color="k", lw=0.8)
  axes[1].set_title("paired difference (points, 95 % CI)", fontsize=10)
  axes[1].legend(fontsize=8)
  for ax in axes:
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)  # local or gs://
  plt.close(fig)
  return path


def plot_coefficients(series: Mapping[str, Mapping[tuple[int, int], Sequence[tuple]]],
                      depth: int, num_heads: int, path: pathlib.Path) -> pathlib.Path:
  """The learned mix coefficients over training, one panel per (layer, head): b (the P V
  weight, solid) and a (the V weight, dashed) vs step, a colour per variant, a line per seed.

  series: {variant: {(layer, head): [(steps, a values, b values) per seed]}}."""
  plt = _pyplot()
  fig, axes = plt.subplots(depth, num_heads, figsize=(2.3 * num_heads, 1.8 * depth),
                           sharex=True, sharey=True, squeeze=False)
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for c, (variant, per_head) in enumerate(series.items()):
    colour = colours[c % len(colours)]
    for (layer, head), seeds in per_head.items():
      ax = axes[layer][head]
      for i, (steps, a, b) in enumerate(seeds):
        ax.plot(steps, b, color=colour, lw=1.0, label=variant if i == 0 else None)
        ax.plot(steps, a, color=colour, lw=0.8, ls="--")
  for layer in range(depth):
    for head in range(num_heads):
      ax = axes[layer][head]
      ax.axhline(0.0, color="k", lw=0.5)
      ax.grid(alpha=0.3)
      ax.tick_params(labelsize=7)
      if layer == 0:
        ax.set_title(f"head {head}", fontsize=8)
      if head == 0:
        ax.set_ylabel(f"layer {layer}", fontsize=8)
  handles, labels = axes[0][0].get_legend_handles_labels()
  if handles:
    fig.legend(handles, labels, loc="upper right", fontsize=7)
  fig.suptitle("mix heads: b (P V weight, solid), a (V weight, dashed) over training",
               fontsize=9)
  fig.tight_layout()
  save_figure(fig, path, dpi=100)  # local or gs://
  plt.close(fig)
  return path


# PCA pictures of patch features (laplax.features.pca.pca_panel makes the panels).
def _as_display(images: np.ndarray) -> np.ndarray:
  images = np.asarray(images)
  if images.dtype == np.uint8:
    images = images.astype(np.float64) / 255.0
  images = np.clip(images, 0.0, 1.0)
  return images[..., 0] if images.shape[-1] == 1 else images


def pca_figure(images: np.ndarray, panels: Mapping[str, tuple[np.ndarray, np.ndarray]],
               path: str | pathlib.Path, *, row_labels: Sequence[str] | None = None,
               cell_inches: float = 1.6, dpi: int = 120) -> pathlib.Path:
  """Writes one PNG: a row per image; columns = image, then per model its PCA RGB and mask.

  Args:
    images: (N, H, W, C) uint8 or floats in [0, 1], C = 1 or 3.
    panels: {model name: (rgb (N, h, w, 3) in [0, 1], mask (N, h, w) or (N, H, W) bool)}, in
      column order (e.g. {'baseline': ..., 'Laplacian': ...}).
    path: the .png to write (parent directories are created).
  Returns:
    the path written.
  """
  images = _as_display(images)
  n = images.shape[0]
  for name, (rgb, mask) in panels.items():
    if np.shape(rgb)[0] != n or np.shape(mask)[0] != n or np.shape(rgb)[-1] != 3:
      raise ValueError(f"panel {name!r}: rgb {np.shape(rgb)} and mask {np.shape(mask)} need "
                       f"(N={n}, h, w, 3) and (N={n}, h, w)")
  cols = 1 + 2 * len(panels)
  plt = _pyplot()
  fig, axes = plt.subplots(n, cols, figsize=(cols * cell_inches, n * cell_inches), dpi=dpi,
                           squeeze=False)
  titles = ["image"] + [f"{name} {kind}" for name in panels for kind in ("PCA", "mask")]
  for i in range(n):
    cells = [images[i]]
    for rgb, mask in panels.values():
      cells += [np.asarray(rgb)[i], np.asarray(mask)[i].astype(np.float64)]
    for j, cell in enumerate(cells):
      ax = axes[i, j]
      grey = cell.ndim == 2
      ax.imshow(cell, cmap="gray" if grey else None, vmin=0, vmax=1,
                interpolation="nearest")
      ax.set_xticks([])
      ax.set_yticks([])
      if i == 0:
        ax.set_title(titles[j], fontsize=8)
    if row_labels is not None:
      axes[i, 0].set_ylabel(row_labels[i], fontsize=7)
  return epath.Path(_save(fig, path, dpi=dpi))
