"""The chat study: every cell runs pretrain -> mid -> SFT -> chat evaluation, with its heads."""

import json

import pytest

from conftest import make_config
from laplax.study import grid



@pytest.mark.slow
def test_each_cell_runs_the_pipeline_with_its_heads_and_the_report_reads_it(tmp_path):
  config = make_config("study_chat", tmp_path / "cache")
  grid.run_study(config, tmp_path / "study", log=lambda *_: None)
  for cell, k in (("k0_s0", 0), ("k2_s0", 2)):
    root = tmp_path / "study" / "cells" / cell
    for stage, source in (("pretrain", None), ("mid", "pretrain"), ("sft", "mid")):
      saved = json.loads((root / stage / "config.json").read_text())
      assert saved["model"]["laplacian_heads"] == k  # the heads never change between stages
      assert saved.get("init_from", "") == ("" if source is None else str(root / source))
      assert (root / stage / "results.json").exists()
    summary = json.loads((root / "results.json").read_text())
    assert set(summary["stages"]) == {"pretrain", "mid", "sft"}
    chat = summary["chat"]
    assert {"arc_easy", "gsm8k", "spelling_bee"} <= set(chat)
    assert all(len(chat[t]["correct"]) == 2 for t in ("arc_easy", "gsm8k", "spelling_bee"))
    # ChatCORE: the chance-centred mean (ARC's baseline 0.25, the generative ones 0)
    want = ((chat["arc_easy"]["accuracy"] - 0.25) / 0.75 + chat["gsm8k"]["accuracy"]
            + chat["spelling_bee"]["accuracy"]) / 3
    assert chat["chatcore"]["chatcore"] == pytest.approx(want)
    # each fine-tuning stage measured its validation data before (the source's model) and after
    assert all(summary["stages"][s]["init_val"]["bpb"] > 0 for s in ("mid", "sft"))
  report = (tmp_path / "study" / "report.md").read_text()
  for heading in ("## Chat benchmarks", "before and after it", "ChatCORE",
                  "| chance | 25.0 | 0.0 | 0.0 | 0.0 |"):
    assert heading in report
