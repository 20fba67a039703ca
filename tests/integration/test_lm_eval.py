"""eval.py's LM mode end to end: the session's GPT run, every task on two items, the geometry."""

import json

import numpy as np
import pytest

from laplax.evals import offline
from laplax.evals.offline import EvalOptions

pytestmark = pytest.mark.slow  # a training run and every LM task


@pytest.fixture(scope="module")
def lm_workdir(lm_run):
  return lm_run.workdir  # the session's trained LM run (conftest); eval.py only reads it


def test_eval_lm_tasks_and_geometry(lm_workdir, shared_data, tmp_path):
  tasks = ["arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval", "lambada"]
  res = offline.evaluate_workdir(lm_workdir, tmp_path / "out", EvalOptions(
      analyze=True, overrides={"lm_tasks.tasks": ",".join(tasks), "lm_tasks.limit": "2",
                               "lm_tasks.final": "true", "lm_tasks.data_dir": str(shared_data),
                               "*.examples": "16"}),
                     log=lambda m: None)
  saved = json.loads((tmp_path / "out" / "eval.json").read_text())
  assert saved["lm_tasks"].keys() == res["lm_tasks"].keys()
  assert 0 < res["val"]["bpb"] == saved["val"]["bpb"]  # the final evaluators run too
  assert res["geometry"]["collapse"] == saved["geometry"]["collapse"]
  assert set(res["lm_tasks"]) == {"arc_easy/letter", "arc_easy/loglik", "arc_challenge/letter",
                               "arc_challenge/loglik", "mmlu/letter", "mmlu/loglik", "gsm8k",
                               "humaneval", "lambada", "five_task_mean/letter",
                               "five_task_mean/loglik"}
  for mode in ("letter", "loglik"):  # the paper's plain mean of its five tasks
    five = [res["lm_tasks"][k]["accuracy"] for k in (f"arc_easy/{mode}", f"arc_challenge/{mode}",
                                                     f"mmlu/{mode}", "gsm8k", "humaneval")]
    mean = res["lm_tasks"].pop(f"five_task_mean/{mode}")
    assert mean["accuracy"] == pytest.approx(np.mean(five)) and mean["num_items"] == 10
  for key, r in res["lm_tasks"].items():
    assert r["num_items"] == 2 and 0.0 <= r["accuracy"] <= 1.0
    assert r["chance"] == (0.25 if key.split("/")[0] in ("arc_easy", "arc_challenge", "mmlu")
                           else 0.0)
  geo = json.loads((tmp_path / "out" / "analysis" / "geometry.json").read_text())
  assert geo["num_windows"] == 16 and geo["num_tokens"] == 16 * 32
  assert len(geo["layers"]) == 3  # embedding + 2 blocks
  assert geo["collapse"]["num_classes"] >= 2
  assert (tmp_path / "out" / "analysis" / "spectrum.png").exists()
  # The mechanism of the GPT's 2 blocks on the same 16 windows (causal P).
  mech = res["mechanism"]
  assert mech["num_sequences"] == 16 and len(mech["layers"]) == 2
  assert all(0 < row["attention_entropy"] < np.log(32) for row in mech["layers"])


def test_eval_lm_errors(lm_workdir, tmp_path):
  run = {"lm_tasks.final": True, "lm_tasks.data_dir": str(tmp_path)}
  with pytest.raises(ValueError, match="unknown task 'nope'"):
    offline.evaluate_workdir(lm_workdir, tmp_path, EvalOptions(overrides={
        **run, "lm_tasks.tasks": ("nope",)}))
  with pytest.raises(ValueError, match="gsm8k"):  # no task data there
    offline.evaluate_workdir(lm_workdir, tmp_path, EvalOptions(overrides={
        **run, "lm_tasks.tasks": "gsm8k", "lm_tasks.data_dir": str(tmp_path / "none")}))
  with pytest.raises(ValueError, match=r"^--set=photos.photos=builtin: no evaluator 'photos' in "
                                       r"this run's config.evals \(\['core', 'geometry', "):
    offline.evaluate_workdir(lm_workdir, tmp_path, EvalOptions(overrides={
        "photos.photos": "builtin"}))
  with pytest.raises(ValueError, match="--evals: no evaluator 'nope' in this run's"):
    offline.evaluate_workdir(lm_workdir, tmp_path, EvalOptions(evals=("nope",)))
  # An evaluator type the run's config lacks runs with its defaults, if it fits the task.
  with pytest.raises(ValueError, match="attention_maps draws image attention \\(a ViT's\\); "
                                       "this 'lm' run's model is a gpt"):
    offline.evaluate_workdir(lm_workdir, tmp_path, EvalOptions(evals=("attention_maps",)))
  with pytest.raises(ValueError, match="--evals=attention_maps adds one of that type"):
    offline.evaluate_workdir(lm_workdir, tmp_path, EvalOptions(overrides={
        "attention_maps.compare": str(lm_workdir)}))


def test_an_lm_export_evaluates_as_its_workdir(lm_workdir, tmp_path):
  """A GPT's export carries its tokenizer; eval.py gives the same numbers on it; --heads
  evaluates the same weights with another head spec."""
  quiet = lambda m: None
  res = offline.evaluate_workdir(lm_workdir, tmp_path / "export", EvalOptions(evals=("val",),
                                                                          export=True), log=quiet)
  manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
  assert manifest["tokenizer"] == "tokenizer.json" and manifest["step"] == res["step"] == 40
  assert (tmp_path / "export" / "tokenizer.json").read_bytes() == \
      (lm_workdir / "tokenizer.json").read_bytes()
  again = offline.evaluate_workdir(tmp_path / "export", tmp_path / "again",
                                   EvalOptions(evals=("val",)), log=quiet)
  assert again["val"] == res["val"]
  switched = offline.evaluate_workdir(tmp_path / "export", tmp_path / "switched",
                                      EvalOptions(evals=("val",), heads=2), log=quiet)
  assert switched["heads"] == {"trained": "k=0", "evaluated": "k=2"}
  assert switched["val"]["bpb"] != res["val"]["bpb"]
