"""The sweep (laplax.study.sweep): one study per depth, the fork's results.csv read from the
cells' own results, a rerun that trains nothing, and the SFT runs aggregated into one report.
In-process checks of the depth-scaled configs: tests/unit/test_sweep.py."""

import csv
import json

import pytest

from conftest import make_config
from laplax.study import sweep
from unit.test_core_eval import write_bundle


FORK_COLUMNS = ("flops_budget,depth,laplacian_heads,seed,model_tag,model_dim,params_wte,"
                "params_value_embeds,params_lm_head,params_transformer,params_scalars,"
                "params_total,num_iterations,tokens_trained,val_bpb,core_score,train_time_sec")


@pytest.mark.slow
def test_a_sweep_runs_each_depth_and_writes_the_forks_results_csv(tmp_path):
  config = make_config("sweep", tmp_path / "cache")
  config.base.evals.core.update(final=True, bundle=str(write_bundle(tmp_path / "bundle")))
  logs = []
  report = sweep.run_sweep(config, tmp_path / "sweep", log=logs.append)
  root = tmp_path / "sweep"
  rows = list(csv.DictReader((root / "results.csv").open()))
  header = (root / "results.csv").read_text().splitlines()[0]
  assert header.startswith(FORK_COLUMNS + ",")  # the fork's columns first, then laplax's
  assert [(r["depth"], r["laplacian_heads"], r["seed"]) for r in rows] == [
      ("1", "0", "0"), ("1", "2", "0"), ("2", "0", "0"), ("2", "2", "0")]
  for r in rows:
    depth, cell = int(r["depth"]), f"k{r['laplacian_heads']}_s0"
    pretrain = root / f"d{depth}" / "cells" / cell / "pretrain"
    saved = json.loads((pretrain / "config.json").read_text())
    assert saved["model"]["depth"] == depth and saved["model"]["width"] == 16 * depth
    results = json.loads((pretrain / "results.json").read_text())
    counts = results["param_groups"]
    assert int(r["params_total"]) == counts["total"] == sum(
        counts[k] for k in ("wte", "value_embeds", "lm_head", "transformer_matrices", "scalars"))
    assert int(r["model_dim"]) == 16 * depth and r["model_tag"] == f"d{depth}_{cell}"
    assert int(r["num_iterations"]) == 4 and int(r["tokens_trained"]) == 4 * 64 * 32
    assert float(r["val_bpb"]) == pytest.approx(results["val"]["bpb"])
    assert float(r["core_score"]) == pytest.approx(results["core"]["core"])
    assert r["flops_budget"] == ""  # a fixed horizon, not the recipe's ratio
    # the paper's LM spectrum of the base model, and the SFT stage after it
    assert float(r["per_sequence_components_99"]) == pytest.approx(
        results["geometry"]["layers"][-1]["per_sequence_components_99"])
    sft = json.loads((pretrain.parent / "sft" / "config.json").read_text())
    assert sft["data"]["rows"] == "bestfit" and sft["init_from"] == str(pretrain)
    assert sft["data"]["batch_size"] == 64 * 32 // 256  # the pretraining's tokens per step
    cell_summary = json.loads((pretrain.parent / "results.json").read_text())
    assert float(r["chatcore"]) == pytest.approx(cell_summary["chat"]["chatcore"]["chatcore"])
    assert float(r["sft_bpb"]) == pytest.approx(cell_summary["stages"]["sft"]["val"]["bpb"])
  for depth in (1, 2):
    sub = (root / f"d{depth}" / "report.md").read_text()
    assert "comps 99 % per sequence" in sub and "CORE of the pretrained model" in sub
  text = report.read_text()
  assert "| 1 | k=0 | 1 |" in text and "| 2 | k=2 (half) |" not in text
  assert "[d1](d1/report.md)" in text and "CORE (%)" in text
  # A rerun trains nothing and writes the same table.
  before = (root / "results.csv").read_text()
  logs.clear()
  sweep.run_sweep(config, root, log=logs.append)
  assert sum("(finished, skipped)" in line for line in logs) == 4
  assert (root / "results.csv").read_text() == before
  # The fork's pipelines run as separate jobs (SFT from the base model) aggregate into the
  # same report: the chains are read back from each SFT run's init_from.
  from laplax.study import aggregate
  runs = [str(root / "d2" / "cells" / cell / "sft") for cell in ("k0_s0", "k2_s0")]
  aggregate.aggregate(tmp_path / "agg", runs, name="agg", log=lambda m: None)
  got, want = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "agg",
                                                                      root / "d2"))
  for key in ("chatcore", "sft_bpb", "pretrain_bpb", "pretrain_core",
              "per_sequence_components_99"):
    assert [r["scores"][key] for r in got["rows"]] == [r["scores"][key] for r in want["rows"]]
