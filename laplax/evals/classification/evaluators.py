"""The image classifier's evaluators: accuracy on a split, per-layer token geometry.

  evals.val = {'type': 'accuracy', 'split': 'val', 'every': 500}
  evals.geometry = {'type': 'vit_geometry', 'examples': 2000, 'final': False, 'analysis': True}

Both read the task's eval_batches (laplax.tasks.classification: in memory, or streamed when
`data.tfds_name` is set, then at `data.eval_crop` through the resized position table).
"""

from __future__ import annotations

import json
from typing import Any

from laplax import multihost
from laplax import sections
from laplax.data import arrays
from laplax.evals.classification import accuracy
from laplax.geometry import plots
from laplax.geometry import vit as vit_geometry
from laplax.train import ranges as ranges_lib
from laplax.train.evaluator import Evaluator
from laplax.train.task import EvalImages


def _check_split(config, task: EvalImages) -> None:
  splits = task.eval_splits()
  if config.split not in splits:
    hint = ("; a streamed data set's 'test' needs data.test_split"
            if config.split == "test" else "")
    raise ValueError(f"split={config.split!r}; this run evaluates on {splits}{hint}")


class Accuracy(Evaluator):
  """Accuracy, top-5 accuracy (k = min(5, classes): accuracy.in_top_k), mean loss and count of
  a split (sharded over the mesh) -> {'accuracy', 'top5', 'loss', 'count'}. Run periodically
  (`every`), results.json's entry also holds the best periodic accuracy (`best`, the trainer's:
  laplax.train.evaluator.best_accuracy)."""

  type = "accuracy"
  defaults = {"split": "val"}
  reads = EvalImages

  @classmethod
  def check(cls, config, task) -> None:
    _check_split(config, task)

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    info = ctx.task.info()
    self._eval_fn = accuracy.make_eval_fn(ctx.model, ctx.mesh, ctx.rules, mean=info.mean,
                                          std=info.std)

  def run(self, weights, step) -> dict[str, Any]:
    task, mesh = self.ctx.task, self.ctx.mesh
    # No batch larger than the split: data.eval_batch_size=10**6 is not a 730 GiB allocation,
    # and a small data set's batches are not mostly padding.
    size = min(task.config.data.eval_batch_size, task.eval_size(self.config.split))
    batches = task.eval_batches(self.config.split, accuracy.host_batch_size(size, mesh))
    return accuracy.evaluate_batches(self._eval_fn, task.eval_params(self.ctx.model,
                                                                     weights.params),
                                     batches, mesh=mesh, rules=self.ctx.rules)

  def summary(self, result) -> str:
    return f"{self.name} accuracy {result['accuracy']:.4f} (top-5 {result['top5']:.4f})"


class VitGeometry(Evaluator):
  """Every geometry metric at every layer (laplax.geometry.vit) of the first `examples` images
  of a split, plus NC3 / NC4 of the final class token; writes analysis/geometry.json and the
  per-layer figures into the context's out directory -> the geometry dict."""

  type = "vit_geometry"
  defaults = {"split": "test", "examples": 2000}
  reads = EvalImages
  ranges = {"examples": ranges_lib.AT_LEAST_ONE}

  @classmethod
  def check(cls, config, task) -> None:
    _check_split(config, task)

  def run(self, weights, step) -> dict[str, Any]:
    task, n, split = self.ctx.task, self.config.examples, self.config.split
    info = task.info()
    # Each host reads its block of every batch: all of them, in order, on every host.
    batches = ({**b, "image": arrays.host_normalize(b["image"], mean=info.mean, std=info.std)}
               for b in map(multihost.gather_rows, task.eval_batches(
                   split, min(n, 250), limit=n)))
    geo = vit_geometry.analyze_batches(
        self.ctx.model, multihost.fetch(task.eval_params(self.ctx.model, weights.params)),
        batches, num_classes=info.num_classes)
    adir = self.ctx.out / "analysis"
    adir.mkdir(parents=True, exist_ok=True)
    (adir / "geometry.json").write_text(json.dumps(geo, indent=2))
    plots.plot_run(geo, adir, title=sections.run_name(task.config))
    return geo

  def summary(self, result) -> str:
    last = result["layers"][-1]
    return (f"{self.name}: last layer within-sequence {last['within_sequence']:.3f}, "
            f"between-class {last['between_class']:.3f}")
