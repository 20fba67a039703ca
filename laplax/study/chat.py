"""The chat study's section: nanochat's pipeline per cell, pretrain -> [mid ->] SFT -> chat eval.

A cell of configs/study_chat.py is four runs in workdir/cells/<cell>/:

  pretrain/  config.base (the lm task) with the cell's heads and seed; its final evaluators
             `core` and `geometry` (CORE, the paper's LM spectra) run when the base enables
             them (study.analysis_windows > 0 turns the geometry on)
  mid/       study.stages.mid (the chat task, packed rows), init_from pretrain/
  sft/       study.stages.sft (the chat task, padded or best-fit rows), init_from mid/, whose
             final evaluator `chat` (laplax.evals.chat.evaluators) scores the benchmarks in
             chat format
  results.json  the cell's summary (written last: the cell is finished)

study.stage_order is ('mid', 'sft') (nanochat at ae0bf52) or ('sft',) (the authors' fork: one
fine-tuning stage from the base model). A stage whose data.batch_size is -1 takes the
pretraining run's batch in rows (the fork's SFT inherits it; the recipe's, when the base sets
none).

A mid stage with its own evals.chat section is scored in chat format too, after mid-training
(nanochat's order: chat_eval after mid-training and after SFT). Every stage takes the cell's
model section and seed, so the heads never change between stages. Scores: validation bits per
byte after each stage, each benchmark's accuracy, the paper's five-task mean (the plain mean of
ARC-E, ARC-C, MMLU, GSM8K and HumanEval) and ChatCORE (nanochat's chance-centred mean), after
SFT and after mid-training, paired over seeds by the study grid.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import jax

from laplax import multihost
from laplax.study import lm as lm_section
from laplax.study.grid import Score, schedule_line
from laplax.tasks import lm as lm_task
from laplax.train import trainer
from laplax.train import workdir as workdir_lib

FINISHED = ("results.json",)
RUNS = ("pretrain", "mid", "sft")  # a cell's runs, in order (the report's cost table)
SCORES = [Score("chat/five_task_mean", "the paper's five-task mean accuracy after SFT (%)",
                scale=100.0, digits=2),
          Score("chatcore", "ChatCORE (chance-centred mean accuracy, %)", scale=100.0,
                digits=2),
          Score("sft_bpb", "SFT validation bits per byte (assistant tokens)",
                higher_is_better=False, scale=1.0, digits=4)]
CLAIMS = lm_section.CLAIMS  # the pretrained model's spectra, when its geometry runs
STAGE_ORDERS = (("mid", "sft"), ("sft",))
# what a cell's summary keeps of its pretraining run (laplax.study.sweep's results.csv reads it)
PRETRAIN_KEYS = ("core", "geometry", "recipe", "param_groups", "tokens_seen")


def scale(key: str) -> tuple[float, int]:
  if key.startswith(("chat/", "mid_chat/")) or key in ("mid_chatcore", "pretrain_core"):
    return 100.0, 1
  if key.startswith("core/"):
    return lm_section.scale(key)
  if key in lm_section.SCALE:
    return lm_section.SCALE[key]
  return (1.0, 4) if key.endswith(("_bpb", "_bpb_before")) else (1.0, 0)


def label(key: str) -> str:
  if key.startswith("chat/"):
    return f"{key[5:]} accuracy (chat format, %)"
  if key.startswith("mid_chat/"):
    return f"{key[9:]} accuracy after mid-training (chat format, %)"
  if key == "mid_chatcore":
    return "ChatCORE after mid-training (%)"
  if key == "pretrain_core":
    return "CORE of the pretrained model (%)"
  if key.startswith("core/") or key in ("cdnv", "components_99"):
    return lm_section.label(key)
  return {"pretrain_bpb": "pretraining validation bits per byte",
          "mid_bpb": "mid-training validation bits per byte",
          "mid_bpb_before": "mid-training validation bits per byte, before it",
          "sft_bpb_before": "SFT validation bits per byte, before it",
          "train_time_s": "train time, all stages (s)"}.get(key, key)


def validate(config) -> None:
  order = tuple(config.study.get("stage_order", ()))
  if order not in STAGE_ORDERS or any(s not in config.study.stages for s in order):
    raise ValueError("study.stage_order must be ('mid', 'sft') or ('sft',), each a config in "
                     "study.stages")
  if "chat" not in config.study.stages.sft.get("evals", {}):
    raise ValueError("study.stages.sft needs an evals.chat section (laplax.evals.chat.evaluators)")


def stage_config(study, name: str, base_cfg, init_from: pathlib.Path):
  """Stage `name`'s run config for a cell: the cell's model and seed, started from
  `init_from`; the SFT stage's chat evaluator runs at the end."""
  cfg = copy.deepcopy(study.stages[name])
  with cfg.unlocked(), cfg.ignore_type():
    cfg.model = copy.deepcopy(base_cfg.model)
    cfg.seed = base_cfg.seed
    cfg.name = f"{base_cfg.name}_{name}"
    cfg.init_from = str(init_from)
    cfg.evals.val.at_init = True  # the stage's validation data before and after it
    if "chat" in cfg.evals:
      cfg.evals.chat.final = True
    if cfg.data.batch_size == -1:  # the pretraining's rows (the recipe's batch when it sets -1)
      tokens = lm_task.recipe_batch_rows(base_cfg) * base_cfg.data.seq_len
      cfg.data.batch_size = tokens // cfg.data.seq_len
  return cfg


def run_cell(cfg, cell_dir: pathlib.Path, study, log) -> dict[str, Any]:
  """Runs (or resumes) the cell's stages in order -> {'results': the cell's summary}."""
  if not (cell_dir / "results.json").exists():
    runs: dict[str, dict[str, Any]] = {}
    with cfg.unlocked():
      if "lm_tasks" in cfg.evals:  # the chat evaluation scores the benchmarks
        cfg.evals.lm_tasks.final = False
      windows = int(study.get("analysis_windows", 0))
      if windows and "geometry" in cfg.evals:  # the paper's LM spectra of the base model
        cfg.evals.geometry.update(final=True, examples=windows)
    runs["pretrain"] = trainer.train_and_evaluate(cfg, cell_dir / "pretrain", log=log)
    previous = cell_dir / "pretrain"
    for name in study.stage_order:
      runs[name] = trainer.train_and_evaluate(stage_config(study, name, cfg, previous),
                                              cell_dir / name, log=log)
      previous = cell_dir / name
    summary = cell_summary(runs)
    if jax.process_index() == 0:  # the hosts of a pod share the cell's directory
      workdir_lib.write_json_atomic(cell_dir / "results.json", summary, indent=2)
    multihost.agree("chat_cell_written", None)
  results = json.loads((cell_dir / "results.json").read_text())
  return {"results": results, "analysis": results.get("pretrain", {}).get("geometry")}


def cell_summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """The cell's results.json from its stages' results {'pretrain': ..., 'mid': ..., 'sft': ...}
  (also for pipelines run as separate jobs: laplax.study.aggregate)."""
  return {"stages": {n: {"val": r["val"], "init_val": r.get("init", {}).get("val"),
                         "step": r["step"], "train_time_s": r["train_time_s"],
                         "corpus": r.get("corpus")}
                     for n, r in runs.items()},
          "chat": runs["sft"]["chat"],
          # the base model's CORE and geometry, where the pretraining ran them
          "pretrain": {k: runs["pretrain"][k] for k in PRETRAIN_KEYS if k in runs["pretrain"]},
          # nanochat's chat_eval after mid-training, where the config evaluates there
          **({"chat_mid": runs["mid"]["chat"]} if "chat" in runs.get("mid", {}) else {})}


def cell_scores(cell: dict[str, Any]) -> dict[str, float]:
  r = cell["results"]
  out = {f"{n}_bpb": s["val"]["bpb"] for n, s in r["stages"].items()}
  out.update({f"{n}_bpb_before": s["init_val"]["bpb"] for n, s in r["stages"].items()
              if s.get("init_val")})
  for prefix, key in (("", "chat"), ("mid_", "chat_mid")):
    if key not in r:
      continue
    out.update({f"{prefix}chat/{k}": v["accuracy"] for k, v in r[key].items()
                if isinstance(v, dict) and "accuracy" in v})
    if "chatcore" in r[key]:
      out[f"{prefix}chatcore"] = r[key]["chatcore"]["chatcore"]
  out["train_time_s"] = sum(s["train_time_s"] for s in r["stages"].values())
  pretrain = r.get("pretrain", {})
  if "core" in pretrain:
    out["pretrain_core"] = pretrain["core"]["core"]
    out.update({f"core/{k}": v["centered"] for k, v in pretrain["core"]["tasks"].items()})
  if pretrain.get("geometry"):
    out.update(lm_section.geometry_scores(pretrain["geometry"]))
  return out


def title(config) -> str:
  stages = ", mid-training" if "mid" in config.study.stage_order else ""
  return f"GPT through nanochat's pipeline (pretrain{stages}, SFT, chat evaluation)"


def setup(config) -> str:
  b, s = config.base, config.study
  chat = s.stages.sft.evals.chat
  text = (f"Model: GPT depth {b.model.depth}, width {b.model.width}, head_dim "
          f"{b.model.head_dim}, vocabulary {b.data.vocab_size}. Pretraining: "
          f"{schedule_line(config)}")
  for name in s.stage_order:
    st = s.stages[name]
    batch = "the pretraining's" if st.data.batch_size == -1 else st.data.batch_size
    text += (f" {'Mid-training' if name == 'mid' else 'SFT'}: {len(st.data.train)} sources, "
             f"{st.data.rows} rows of {st.data.seq_len} tokens, batch {batch}, lr x "
             f"{st.optim.lr_scale}.")
  return text + (f" Chat evaluation: {', '.join(chat.tasks)} on the first {chat.limit or 'all'} "
                 f"items, greedy, up to {chat.max_new_tokens} new tokens.")


def sections(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """Per-benchmark accuracies next to chance (after SFT, and after mid-training when scored),
  the bits per byte after each stage, and the pretrained model's spectra when measured."""
  results = done[(specs[0], summary["rows"][0]["seeds"][0])]["results"]
  lines = []
  for key, prefix, when in (("chat", "", "after SFT"), ("chat_mid", "mid_", "after mid-training")):
    if key not in results:
      continue
    first = results[key]
    tasks = [k for k, v in first.items() if isinstance(v, dict) and "accuracy" in v]
    lines += [f"## Chat benchmarks {when} (accuracy %, mean over seeds; first row: chance)", "",
              "`five_task_mean`: the paper's headline, the plain mean of ARC-E, ARC-C, MMLU, "
              "GSM8K and HumanEval." if "five_task_mean" in tasks else
              "The paper's five-task mean needs ARC-E, ARC-C, MMLU, GSM8K and HumanEval: not "
              "all of them ran.", "",
              "| heads | " + " | ".join(tasks) + " | ChatCORE |",
              "| --- |" + " --- |" * (len(tasks) + 1),
              "| chance | " + " | ".join(f"{first[k]['chance'] * 100:.1f}" for k in tasks)
              + " | 0.0 |"]
    for row in summary["rows"]:
      sc = row["scores"]
      mean = lambda k: sum(sc[k]) / len(sc[k]) * 100 if k in sc else float("nan")
      lines.append(f"| {row['name']} | " + " | ".join(f"{mean(prefix + 'chat/' + k):.1f}"
                                                     for k in tasks)
                   + f" | {mean(prefix + 'chatcore'):.2f} |")
    lines.append("")
  lines += ["## Bits per byte of each stage's validation data, before and after it "
            "(mean over seeds)", "",
            "Each stage has its own validation data: the text corpus (pretraining), held-out "
            "conversations, every token (mid-training), held-out conversations, the "
            "assistant's tokens (SFT).", "",
            "| heads | pretrain | mid: before -> after | SFT: before -> after |",
            "| --- | --- | --- | --- |"]
  for row in summary["rows"]:
    sc = row["scores"]
    m = lambda k: f"{sum(sc[k]) / len(sc[k]):.4f}" if k in sc else "-"
    lines.append(f"| {row['name']} | {m('pretrain_bpb')} | {m('mid_bpb_before')} -> "
                 f"{m('mid_bpb')} | {m('sft_bpb_before')} -> {m('sft_bpb')} |")
  lines.append("")
  if all(done[(spec, seed)].get("analysis") for spec, row in zip(specs, summary["rows"])
         for seed in row["seeds"]):
    lines += ["The pretrained models' geometry (before any chat stage):", "",
              *lm_section.geometry_section(workdir, specs, done, summary)]
  return lines
