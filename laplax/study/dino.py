"""The DINO study's section: probe scores of the frozen teachers, patch-token spectra, PCA.

A cell pretrains with DINO (laplax.train.trainer); its evaluators (laplax.evals.dino) write
everything the report reads into results.json: k-NN / linear / transfer / horse-segmentation
scores and the per-layer patch-token spectra of its teacher. The report adds the spectra table
and figure and PCA pictures of the baseline and the first Laplacian spec for the first seed
that has both.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from laplax.data import builders, arrays
from laplax.data import photos as photos_lib
from laplax.data.images import load_image_data
from laplax.evals import attention_maps
from laplax.evals.dino import segmentation
from laplax.features import extract as features
from laplax.geometry import dino as dino_geometry
from laplax.geometry import plots
from laplax.study.cells import cell_run
from laplax.study.grid import Claim, Score, cells_by_name, schedule_line
from laplax.train import analysis
from laplax.train import evaluator as evaluator_lib
from laplax.train import trainer

FINISHED = ("results.json",)
SCORES = [Score("knn_top1_k20", "k-NN top-1, k = 20 (%)"),
          Score("linear_last", "linear probe, last class tokens (%)"),
          # the paper's DINO number (29.81 -> 32.27 % for ViT-S-5L): pod runs (evals.ade20k)
          Score("ade20k_miou", "ADE20K linear segmentation mIoU (%)")]
# The paper: patch-token spectra decay faster "within an image" with Laplacian heads: the
# per-image count (a mean over images); the pooled count stays beside it.
CLAIMS = [Claim("per_sequence_components_99",
                "last-layer patch tokens: components for 99 % of an image's variance", -1)]
SCALE = {"components_99": (1.0, 1), "effective_rank": (1.0, 2),
         "per_sequence_components_99": (1.0, 2), "per_sequence_effective_rank": (1.0, 2)}
_LABELS = {"linear_cls": "linear probe (class token) (%)",
           "linear_last": "linear probe (last class tokens) (%)",
           "horse_probe_fg_iou": "horse segmentation probe fg IoU (%)",
           "horse_probe_miou": "horse segmentation probe mIoU (%)",
           "horse_pca_mask_fg_iou": "horse PCA-mask fg IoU (%)",
           "effective_rank": "last-layer patch tokens: effective rank, pooled over images",
           "components_99": "last-layer patch tokens: components for 99 %, pooled over images",
           "per_sequence_effective_rank": "last-layer patch tokens: effective rank per image",
           "linear_dino": "linear probe, DINO's protocol (%)",
           "ade20k_pixel_acc": "ADE20K pixel accuracy (%)"}


def label(key: str) -> str:
  if "/" in key:  # a transfer probe: '<data set>/<score>'
    name, score = key.split("/", 1)
    return f"{name}: {label(score)}"
  if key.startswith("knn_top1_k"):
    return f"k-NN top-1, k = {key[len('knn_top1_k'):]} (%)"
  return _LABELS.get(key, key)


def scale(key: str) -> tuple[float, int]:
  return SCALE.get(key, (100.0, 2))


def run_cell(cfg, cell_dir: pathlib.Path, study, log) -> dict[str, Any]:
  """Trains (or resumes) one cell -> {'results', 'spectra'} (its spectra evaluator measures
  the first study.analysis_examples evaluation images at the end)."""
  if "spectra" in cfg.evals:
    with cfg.unlocked():  # a config from the command line is locked
      cfg.evals.spectra.update(final=True, examples=int(study.analysis_examples))
  if not (cell_dir / "results.json").exists():
    trainer.train_and_evaluate(cfg, cell_dir, log=log)
  results = json.loads((cell_dir / "results.json").read_text())
  return {"results": results, "spectra": results.get("spectra")}


def cell_scores(cell: dict[str, Any]) -> dict[str, float]:
  """Test k-NN / linear probes (a streamed run's: on its evaluation split), horse IoUs,
  transfer probes, ADE20K, last-layer spectrum."""
  results = cell["results"]
  probes = results["probes"]
  out = {k: float(v) for k, v in probes.get("test", probes.get("val", {})).items()
         if k != "count"}
  if "ade20k" in results:
    out["ade20k_miou"] = float(results["ade20k"]["miou"])
    out["ade20k_pixel_acc"] = float(results["ade20k"]["pixel_acc"])
  horse = results.get("horse")
  if horse:
    out["horse_probe_fg_iou"] = float(horse["probe"]["fg_iou"])
    out["horse_probe_miou"] = float(horse["probe"]["miou"])
    out["horse_pca_mask_fg_iou"] = float(horse["pca_mask"]["fg_iou"])
  for name, scores in results.get("transfer", {}).items():
    out.update({f"{name}/{k}": float(v) for k, v in scores["test"].items() if k != "count"})
  if cell.get("spectra"):
    last = cell["spectra"]["layers"][-1]
    for key in ("per_sequence_components_99", "components_99", "per_sequence_effective_rank",
                "effective_rank", "per_sequence_length"):
      if key in last:
        out[key] = float(last[key])
  return out


def _first_bound(specs, done, summary) -> str:
  """The baseline's first cell's per-image rank bound and token count, as the report says it."""
  last = done[(specs[0], summary["rows"][0]["seeds"][0])]["spectra"]["layers"][-1]
  if "per_sequence_rank_bound" not in last:
    return "?"
  return (f"{last['per_sequence_rank_bound']} ({last.get('per_sequence_length', '?')} patch "
          "tokens)")


def title(config) -> str:
  return f"DINO on {config.base.data.name}"


def setup(config) -> str:
  b = config.base
  evals = evaluator_lib.sections(b)  # their defaults filled in
  train_size = evals["probes"].get("probe_train_size")
  measured = (f"spectra over {config.study.analysis_examples} evaluation images"
              if "spectra" in evals else "no spectra")
  if "ade20k" in evals:
    measured += f"; ADE20K linear probe at {evals['ade20k'].crop} px"
  return (f"Model: ViT preset `{b.model.get('preset')}`, patch {b.model.patch_size}; DINO head "
          f"out_dim {b.head.out_dim}, crops 2 x {b.multicrop.global_size} px + "
          f"{b.multicrop.num_local} x {b.multicrop.local_size} px; {schedule_line(config)} "
          f"Probes on the frozen teacher (k-NN bank: all training images; linear-probe "
          f"training set: {train_size or 'all'}); {measured}.")


def sections(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """Segmentation note, spectra table and figure, PCA pictures."""
  b = config.base
  names = {spec: row["name"] for spec, row in zip(specs, summary["rows"])}
  keys = list(summary["rows"][0]["scores"])
  streamed = bool(b.data.get("tfds_name"))  # a pod run: no in-memory splits to picture
  spectra = all(cell.get("spectra") for cell in done.values())
  if spectra:
    plots.plot_spectrum(cells_by_name(specs, done, summary, "spectra"),
                        workdir / "spectrum.png",
                        title="Patch-token spectral decay of the DINO teachers")
  pca = {} if streamed else pca_figure(config, specs, done, names, workdir, workdir / "pca.png")
  summary["pca"] = pca
  lines = ["## Segmentation probe (Weizmann horses)", ""]
  if any(k.startswith("horse_") for k in keys):
    lines.append("Linear per-patch probe on frozen last-block patch tokens and the thresholded "
                 "first PCA component, both scored against the test masks (rows `horse ...` "
                 "above).")
  else:
    lines.append(f"Not measured: eval.horse_dir is unset, or the models read grey "
                 f"{b.data.name} images and cannot take the RGB horse photos.")
  transfer = sorted({k.split("/")[0] for k in keys if "/" in k})
  if transfer:
    lines += ["", f"Rows `{', '.join(transfer)}: ...` probe the same frozen teachers on "
              f"another data set (transfer): its images converted to {b.data.name}'s channels "
              "and crop size, the probes trained on its training split."]
  if not spectra:
    return lines + ["", "## Spectral decay and PCA of patch tokens", "",
                    "Not measured: the cells have no dino_spectra evaluator.", ""]
  lines += ["", "## Spectral decay of patch tokens (mean over seeds)", "",
            "Layer 0 is the patch embedding, layer l the output of block l (no final norm); "
            "class token excluded. Per image (the paper's \"within an image\"): each image's "
            "own covariance of its patch tokens, the counts averaged over images (at most "
            f"min(tokens - 1, width) = {_first_bound(specs, done, summary)}: runs compare only "
            "at one resolution). Pooled: one covariance over all images' patch tokens.", "",
            "| heads | layer | per image 90 % | 95 % | 99 % | eff. rank | pooled 90 % | 95 % | "
            "99 % | eff. rank |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  nan = float("nan")
  for spec, row in zip(specs, summary["rows"]):
    layers = [done[(spec, s)]["spectra"]["layers"] for s in row["seeds"]]
    for l in range(len(layers[0])):
      # undefined values (null in results.json) stay NaN; the 'undefined' reasons are not numbers
      m = {k: float(np.mean([nan if run[l][k] is None else run[l][k] for run in layers]))
           for k in layers[0][l] if k != "undefined"}
      lines.append(f"| {row['name']} | {l} | {m.get('per_sequence_components_90', nan):.2f} | "
                   f"{m.get('per_sequence_components_95', nan):.2f} | "
                   f"{m.get('per_sequence_components_99', nan):.2f} | "
                   f"{m.get('per_sequence_effective_rank', nan):.2f} | "
                   f"{m['components_90']:.1f} | {m['components_95']:.1f} | "
                   f"{m['components_99']:.1f} | {m['effective_rank']:.2f} |")
  lines += ["", "![spectrum](spectrum.png)", "", "## PCA of patch features", ""]
  if pca:
    lines.append(f"Seed {pca['seed']}: the first three principal components of the last-block "
                 "patch tokens as RGB, and the first one thresholded at 0 (sign: the border "
                 "patches are background).")
    for fig in pca["figures"]:
      lines += ["", f"### {fig['images']}", ""]
      lines.append("One PCA per photo (unrelated scenes: a joint PCA's first component would "
                   "mostly separate the photos)." if fig.get("per_image") else
                   "One PCA over all images of the set (first rows drawn).")
      for name, s in fig.get("scores", {}).items():
        lines.append(f"- {name}: PCA-mask fg IoU {s['fg_iou'] * 100:.2f}, mIoU "
                     f"{s['miou'] * 100:.2f}")
      lines += ["", f"![pca]({fig['path']})"]
  else:
    lines.append("No seed has both the baseline and a Laplacian cell yet.")
  attention = attention_figure(config, specs, done, names, workdir / "attention_maps.png")
  if attention:
    lines += ["", "## Attention maps", "",
              f"Seed {attention['seed']}, the teachers' last block: the class token's attention "
              f"P over the patches of {attention['images']}, per head (each panel on its own "
              "scale). An ordinary head adds these weighted values to the class token; a "
              "Laplacian head subtracts them from its own value.", "",
              "![attention maps](attention_maps.png)"]
  return lines + [""]


def attention_figure(config, specs, done, names, path: pathlib.Path, num_images: int = 4
                     ) -> dict[str, Any]:
  """Class-token attention maps of the baseline and the first Laplacian teacher (first seed
  with both) on the photo_pca evaluator's photos (RGB runs with one) or the first test images
  -> {'seed', 'images'} ({} without such a seed)."""
  base, lap = specs[0], specs[1]
  seeds = [s for s in config.study.seeds if (base, s) in done and (lap, s) in done]
  if not seeds:
    return {}
  seed, b = seeds[0], config.base
  subjects = {}
  for spec in (base, lap):
    t = features.frozen_teacher(workdir_of(path, spec, seed))
    subjects[names[spec]] = analysis.AnalysedModel("vit", t.model.backbone, t.params["backbone"],
                                                   t.base_grid, t.model.backbone.head_table)
  info = builders.dataset_info(b.data.name)
  photo = [e for e in evaluator_lib.sections(b).values() if e.type == "photo_pca"]
  if photo and info.image_shape[-1] == 3:
    labels, raw = photos_lib.load_photos(photo[0].size, photo[0].photos)
    raw, labels, what = raw[:num_images], labels[:num_images], "photos"
  else:
    raw = load_image_data(b.data)["test"][0][:num_images]
    labels, what = [f"test {i}" for i in range(len(raw))], f"{b.data.name} test images"
  images = arrays.normalize(raw, mean=info.mean, std=info.std)
  attention_maps.comparison(subjects, images, path, mean=info.mean, std=info.std,
                            row_labels=labels)
  return {"seed": seed, "images": what}


def workdir_of(path: pathlib.Path, spec, seed: int) -> pathlib.Path:
  """A cell's run folder next to the study's report files (laplax.study.cells.cell_run)."""
  return cell_run(path.parent, spec, seed)


def pca_figure(config, specs, done, names, workdir: pathlib.Path, path: pathlib.Path
               ) -> dict[str, Any]:
  """PCA pictures of the baseline and the first Laplacian spec for the first seed that has
  both. RGB models: the horse test photos at path (with PCA-mask IoU, when the base config
  has a horse evaluator) and the packaged photos (laplax.data.photos) at path's sibling
  pca_photos.png (when it has a photo_pca one); grey ones: the data set's first test images at
  path.
  -> {'seed', 'figures': [{'path', 'images', 'scores' (horses only)}]}."""
  base, lap = specs[0], specs[1]
  seeds = [s for s in config.study.seeds if (base, s) in done and (lap, s) in done]
  if not seeds:
    return {}
  seed = seeds[0]
  # Loaded once for all figures: one restore and one feature compilation per teacher.
  teachers = {names[spec]: features.frozen_teacher(done[(spec, seed)]["dir"])
              for spec in (base, lap)}
  b, n = config.base, config.study.pca_images
  kw = dict(batch_size=b.data.eval_batch_size)
  figures = []
  if builders.dataset_info(b.data.name).image_shape[-1] == 1:
    images = load_image_data(b.data)["test"][0][:config.study.pca_fit_images]
    dino_geometry.pca_comparison(teachers, images, path, num_images=n, **kw)
    figures.append({"path": path.name, "images": f"{b.data.name} test images"})
  by_type = {e.type: e for e in evaluator_lib.sections(b).values()}
  if "horse" in by_type:
    horse = by_type["horse"]
    test = segmentation.load_weizmann_horse(horse.dir, horse.size, "test")
    scores = dino_geometry.pca_comparison(teachers, test.images, path, masks=test.masks,
                                          num_images=n, row_labels=test.names, **kw)
    figures.append({"path": path.name, "images": "Weizmann horse test photos",
                    "scores": scores})
  if "photo_pca" in by_type:
    chosen = by_type["photo_pca"]
    photo_names, photos = photos_lib.load_photos(chosen.size, chosen.photos)
    other = path.with_name("pca_photos.png")
    dino_geometry.pca_comparison(teachers, photos, other, num_images=len(photos),
                                 row_labels=photo_names, per_image=True, **kw)
    figures.append({"path": other.name, "images": "photos shipped with scikit-image, "
                    "scikit-learn and matplotlib" if chosen.photos == "builtin"
                    else f"the photos in {chosen.photos}", "per_image": True})
  return {"seed": seed, "figures": figures}
