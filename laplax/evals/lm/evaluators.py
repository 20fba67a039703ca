"""The language model's evaluators: validation bits per byte, benchmark tasks, geometry.

  evals.val = {'type': 'bpb', 'every': 200}
  evals.lm_tasks = {'type': 'lm_tasks', 'tasks': ('arc_easy', 'gsm8k'), 'limit': 50,
                    'final': False}
  evals.geometry = {'type': 'lm_geometry', 'examples': 256, 'final': False, 'analysis': True}

They read the task's validation text and tokenizer (laplax.train.task.EvalTokens; laplax.tasks.lm).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from laplax import sections
from laplax.data.shared import shared_data_dir
from laplax.evals.lm import bpb as bpb_lib
from laplax.evals.lm import tasks as lm_tasks
from laplax.geometry import lm as lm_geometry
from laplax.geometry import plots
from laplax.train import ranges as ranges_lib
from laplax.train.evaluator import Evaluator
from laplax.train.task import EvalTokens


class BitsPerByte(Evaluator):
  """Mean next-token loss (nats) and bits per byte over the validation windows
  (data.eval_windows, data.eval_batch_size) -> {'loss', 'bpb', ...}."""

  type = "bpb"
  reads = EvalTokens

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    self._eval_fn = bpb_lib.make_eval_fn(ctx.model, ctx.task.tokenizer.token_byte_lengths(),
                                         ctx.mesh, ctx.rules)

  def run(self, weights, step) -> dict[str, Any]:
    return bpb_lib.evaluate(self._eval_fn, weights.params, self.ctx.task.val_batches(),
                            self.ctx.mesh, self.ctx.rules)

  def summary(self, result) -> str:
    return f"{self.name} loss {result['loss']:.4f}, {self.name} bpb {result['bpb']:.4f}"


class Benchmarks(Evaluator):
  """Benchmark tasks (laplax.evals.lm.tasks: ARC, MMLU, GSM8K, HumanEval, LAMBADA), each
  accuracy next to its chance level, on the first `limit` items (0: all) of the task data in
  `data_dir` ('': $LAPLAX_SHARED_DATA or ../shared/data) -> {'arc_easy/letter': {...}, ...}."""

  type = "lm_tasks"
  reads = EvalTokens
  defaults = {"tasks": (), "limit": 0, "data_dir": "", "batch_size": 8}
  ranges = {"limit": ranges_lib.COUNT, "batch_size": ranges_lib.AT_LEAST_ONE}  # limit 0: all

  @classmethod
  def check(cls, config, task) -> None:
    for t in config.tasks:
      lm_tasks.get_task(t)  # an unknown name fails before any work

  def run(self, weights, step) -> dict[str, Any]:
    if not self.config.tasks:
      return {}
    task = self.ctx.task
    logprob_fn, generate_fn = lm_tasks.make_model_fns(
        self.ctx.model, {"params": weights.params}, task.tokenizer,
        max_len=max(task.config.data.seq_len, 256), batch_size=self.config.batch_size)
    return lm_tasks.run_tasks(list(self.config.tasks),
                              self.config.data_dir or str(shared_data_dir()),
                              logprob_fn=logprob_fn, generate_fn=generate_fn,
                              limit=self.config.limit or None, log=self.ctx.log)

  def summary(self, result) -> str:
    return ", ".join(f"{k} {r['accuracy']:.4f}" for k, r in result.items())


class LmGeometry(Evaluator):
  """Linguistic collapse (CDNV over next-token classes) and per-layer spectral decay, pooled
  and per sequence of `window` positions (0: the whole window, data.seq_len), of the first
  `examples` validation windows (laplax.geometry.lm); writes analysis/geometry.json and
  analysis/spectrum.png -> the geometry dict."""

  type = "lm_geometry"
  reads = EvalTokens
  defaults = {"examples": 256, "batch_size": 8, "window": 0}
  ranges = {"examples": ranges_lib.AT_LEAST_ONE, "batch_size": ranges_lib.AT_LEAST_ONE,
            "window": ranges_lib.COUNT}

  @classmethod
  def check(cls, config, task) -> None:
    seq_len = task.config.data.seq_len
    if config.window and not 2 <= config.window <= seq_len:  # an integer >= 0: the ranges
      raise ValueError(f"window={config.window!r} must be 0 (the whole window) or lie in "
                       f"[2, data.seq_len={seq_len}]")

  def run(self, weights, step) -> dict[str, Any]:
    batches = self.ctx.task.val_windows(self.config.batch_size, self.config.examples)
    windows = np.concatenate([b["tokens"][np.asarray(b["mask"], bool)] for b in batches])
    geo = lm_geometry.analyze_lm(self.ctx.model, {"params": weights.params}, windows,
                                 batch_size=self.config.batch_size, window=self.config.window)
    adir = self.ctx.out / "analysis"
    adir.mkdir(parents=True, exist_ok=True)
    (adir / "geometry.json").write_text(json.dumps(geo, indent=2))
    name = sections.run_name(self.ctx.task.config)
    plots.plot_spectrum({name: geo}, adir / "spectrum.png", title=f"Spectral decay: {name}")
    return geo

  def summary(self, result) -> str:
    return f"{self.name}: CDNV {result['collapse']['cdnv']:.4g}"
