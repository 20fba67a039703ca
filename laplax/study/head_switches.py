r"""Which heads matter: every single-head switch of a trained image classifier, at evaluation.

For each head (layer l, head h) of a trained run (a workdir or an export), the same weights are
evaluated with that one head's operator switched (eval.py --heads does one such spec): a
Laplacian head (any operator but plain attention) back to P V, a plain head to (I - P) V. Also
every head switched at once. Each is scored on the same images as the trained spec, so the
accuracy changes are paired: the interval is the mean +- 1.96 standard errors of the per-image
differences of correctness.

  python -m laplax.study.head_switches --workdir=runs/main_k4 --out=runs/main_k4/switches

Writes OUT/head_switches.json ({'trained', 'split', 'count', 'accuracy', 'switches': [{'layer',
'head', 'from', 'to', 'accuracy', 'delta', 'ci95'}], 'all_switched'}) and OUT/head_switches.png
(the (depth, heads) table of accuracy changes).
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

from absl import app, flags
import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from laplax import cli  # noqa: E402
from laplax import heads as heads_lib  # noqa: E402
from laplax.data import arrays  # noqa: E402
from laplax.evals import offline  # noqa: E402
from laplax.train import task as task_lib  # noqa: E402
from laplax.train import workdir as workdir_lib  # noqa: E402


def switched_spec(table: heads_lib.Table, layer: int | None, head: int | None):
  """The table with head (layer, head) switched (None, None: every head), as operator names."""
  flip = lambda op: heads_lib.LAPLACIAN if op == heads_lib.ATTENTION else heads_lib.ATTENTION
  return tuple(tuple((flip(op) if layer is None or (i == layer and h == head) else op).name
                     for h, op in enumerate(row)) for i, row in enumerate(table))


def correct(run, images: np.ndarray, labels: np.ndarray, info, batch_size: int) -> np.ndarray:
  """bool (N,): whether the run's model classifies each image right (at the task's evaluation
  crop: run.task.eval_params)."""
  @jax.jit
  def predict(params, x):
    x = arrays.device_normalize(x, info.mean, info.std)
    return jnp.argmax(run.model.apply({"params": params}, x), -1)
  params = run.task.eval_params(run.model, run.params)
  out = [np.asarray(predict(params, images[i:i + batch_size]))
         for i in range(0, len(images), batch_size)]
  return np.concatenate(out) == labels


def split_arrays(task, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(uint8 images (N, H, W, C), labels (N,)) of `split` at the evaluation crop, in order."""
  batches = list(task.eval_batches(split, int(task.config.data.eval_batch_size),
                                   process_index=0, process_count=1))
  keep = [np.asarray(b["mask"], bool) for b in batches]
  return (np.concatenate([b["image"][k] for b, k in zip(batches, keep)]),
          np.concatenate([b["label"][k] for b, k in zip(batches, keep)]))


def study(workdir, out, *, split: str = "test", log=print) -> dict[str, Any]:
  """Runs every single-head switch (and all at once) of the run in `workdir`; writes out/."""
  out = workdir_lib.as_path(out)
  run = offline.load(workdir, log=log)
  task = run.task
  if not isinstance(task, task_lib.EvalImages):
    raise ValueError(f"{workdir} is a {task.name!r} run: the head-switch study scores an "
                     "image classifier (eval.py --heads evaluates any run)")
  task.load_data(run.workdir, log)
  images, labels = split_arrays(task, split)
  info = task.info()
  batch = min(int(task.config.data.eval_batch_size), len(labels))
  table = heads_lib.head_table(run.model.laplacian_heads, run.model.num_heads, run.model.depth)
  base = correct(run, images, labels, info, batch)
  cases = [(i, h) for i in range(len(table)) for h in range(len(table[0]))] + [(None, None)]
  rows, t0 = [], time.time()
  for n, (i, h) in enumerate(cases):
    switched = offline.switch_heads(run, switched_spec(table, i, h))
    hits = correct(switched, images, labels, info, batch)
    diff = hits.astype(np.float64) - base
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    rows.append({"layer": i, "head": h,
                 "from": None if i is None else table[i][h].name,
                 "to": None if i is None else switched_spec(table, i, h)[i][h],
                 "heads": heads_lib.model_heads(switched.model),
                 "accuracy": float(hits.mean()), "delta": float(diff.mean()),
                 "ci95": [float(diff.mean() - 1.96 * se), float(diff.mean() + 1.96 * se)]})
    done = n + 1
    log(f"[head switches] {done}/{len(cases)} {rows[-1]['heads']}: accuracy "
        f"{rows[-1]['accuracy']:.4f} ({rows[-1]['delta']:+.4f}); ETA "
        f"{(time.time() - t0) / done * (len(cases) - done):.0f} s")
  result = {"workdir": str(workdir), "trained": heads_lib.model_heads(run.model), "split": split,
            "count": int(len(labels)), "accuracy": float(base.mean()), "step": run.step,
            "switches": rows[:-1], "all_switched": rows[-1]}
  out.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(out / "head_switches.json", result, indent=2)
  plot([result], pathlib.Path(out) / "head_switches.png")
  return result


def _short(name: str) -> str:
  return {"attention": "P", "laplacian": "L"}.get(name, name)


def plot(results: list[dict[str, Any]], path: pathlib.Path) -> pathlib.Path:
  """One panel per study: the (depth, heads) accuracy change (points) of each single-head
  switch, with its paired 95 % interval."""
  fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.6), squeeze=False)
  for ax, result in zip(axes[0], results):
    depth = 1 + max(r["layer"] for r in result["switches"])
    heads = 1 + max(r["head"] for r in result["switches"])
    delta = np.zeros((depth, heads))
    for r in result["switches"]:
      delta[r["layer"], r["head"]] = 100 * r["delta"]
    span = max(np.abs(delta).max(), 0.1)
    im = ax.imshow(delta, cmap="RdBu", vmin=-span, vmax=span)
    for r in result["switches"]:
      lo, hi = (100 * v for v in r["ci95"])
      value = 100 * r["delta"]
      ax.text(r["head"], r["layer"], f"{_short(r['from'])}>{_short(r['to'])} {value:+.1f}\n"
              f"[{lo:+.1f}, {hi:+.1f}]", ha="center", va="center", fontsize=7.5,
              color="white" if abs(value) > 0.6 * span else "black")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(depth))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, shrink=0.8, label="test accuracy change (points)")
    every = result["all_switched"]
    ax.set_title(f"trained {result['trained']}: {100 * result['accuracy']:.2f} % "
                 f"({result['count']} {result['split']} images)\none head switched "
                 f"(P: P V, L: (I - P) V); all: {100 * every['delta']:+.1f}", fontsize=9)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


FLAGS = flags.FLAGS
flags.DEFINE_list("workdir", None, "Trained image classifiers' workdirs or exports (several: "
                  "one panel each in OUT/head_switches.png, OUT/<i>/ their own files).")
flags.DEFINE_string("out", None, "Output directory (default WORKDIR/head_switches).")
flags.DEFINE_string("split", "test", "The split to score ('val' or 'test').")


def main(argv):
  del argv
  cli.quiet_logging()
  cli.configure_xla()

  def work():
    log = lambda message: print(message, file=sys.stderr)
    workdirs = FLAGS.workdir
    out = workdir_lib.as_path(FLAGS.out or workdir_lib.as_path(workdirs[0]) / "head_switches")
    results = []
    for i, workdir in enumerate(workdirs):
      results.append(study(workdir, out if len(workdirs) == 1 else out / str(i),
                           split=FLAGS.split, log=log))
      print(f"{workdir}: {results[-1]['trained']} {results[-1]['accuracy']:.4f}")
    if len(results) > 1:
      plot(results, pathlib.Path(out) / "head_switches.png")
    print(f"written to {out}")

  cli.run_main(work)


if __name__ == "__main__":
  flags.mark_flag_as_required("workdir")
  app.run(main, flags_parser=cli.parse_flags)
