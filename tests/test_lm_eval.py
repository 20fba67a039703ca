"""eval.py's LM mode end to end: a few-step GPT run, every task on two items, the geometry."""

import json

import pytest

from configs import lm_test
from laplax import evaluate
from laplax.train import lm


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, shared_data):
  config = lm_test.get_config()
  tmp = tmp_path_factory.mktemp("lm_eval")
  config.data.sources = (str(shared_data / "text" / "tinyshakespeare" / "input.txt"),)
  config.data.cache_dir = str(tmp / "cache")
  config.data.tokenizer_train_chars = 20_000
  config.total_steps = 4
  config.eval_every = 0
  config.checkpoint.every_steps = 4
  lm.train_and_evaluate(config, tmp / "run", log=lambda m: None)
  return tmp / "run"


def test_eval_lm_tasks_and_geometry(lm_run, shared_data, tmp_path):
  tasks = ["arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval", "lambada"]
  res = evaluate.run(lm_run, tmp_path / "out", tasks=tasks, limit=2, data_dir=shared_data,
                     analyze=True, analysis_examples=16, log=lambda m: None)
  saved = json.loads((tmp_path / "out" / "eval.json").read_text())
  assert saved["tasks"].keys() == res["tasks"].keys()
  assert set(res["tasks"]) == {"arc_easy/letter", "arc_easy/loglik", "arc_challenge/letter",
                               "arc_challenge/loglik", "mmlu/letter", "mmlu/loglik", "gsm8k",
                               "humaneval", "lambada"}
  for key, r in res["tasks"].items():
    assert r["num_items"] == 2 and 0.0 <= r["accuracy"] <= 1.0
    assert r["chance"] == (0.25 if key.split("/")[0] in ("arc_easy", "arc_challenge", "mmlu")
                           else 0.0)
  geo = json.loads((tmp_path / "out" / "analysis" / "geometry.json").read_text())
  assert geo["num_windows"] == 16 and geo["num_tokens"] == 16 * 32
  assert len(geo["layers"]) == 3  # embedding + 2 blocks
  assert geo["collapse"]["num_classes"] >= 2
  assert (tmp_path / "out" / "analysis" / "spectrum.png").exists()


def test_eval_lm_errors(lm_run, tmp_path):
  with pytest.raises(ValueError, match="unknown task 'nope'"):
    evaluate.run(lm_run, tmp_path, tasks=["nope"], data_dir=tmp_path)
  with pytest.raises(ValueError, match="data_dir"):
    evaluate.run(lm_run, tmp_path, tasks=["gsm8k"])
  with pytest.raises(ValueError, match="--export is for image classifiers"):
    evaluate.run(lm_run, tmp_path, export=True)
