"""The study's parts: the paired-difference interval, a report section for every task (picked by
name), and a summary that refuses per-sequence counts of different lengths.
A miniature study end to end: tests/integration/test_study.py."""


import numpy as np
import pytest

from conftest import make_config
from laplax.study import grid, stats


def test_paired_difference_interval():
  mean, lo, hi = stats.paired_difference(np.array([0.80, 0.81, 0.82]), np.array([0.82, 0.83, 0.84]))
  assert mean == pytest.approx(0.02)
  assert lo == pytest.approx(0.02) and hi == pytest.approx(0.02)  # constant difference: no spread
  mean, lo, hi = stats.paired_difference(np.array([0.8, 0.9]), np.array([0.9, 0.8]))
  assert mean == pytest.approx(0.0) and lo < 0 < hi


def test_every_task_has_a_report_section_and_study_section_picks_one_by_name():
  from laplax.study import cells
  from laplax.train import task as task_lib
  assert set(cells.TASK_SECTIONS) == set(task_lib.TASKS)  # a new task gets a line (or none)
  for kind, section in (("study_vit", "classification"), ("study_lm", "lm"),
                        ("study_dino", "dino"), ("study_chat", "chat")):
    assert cells.section_for(make_config(kind))[1].__name__ == f"laplax.study.{section}"
  c = make_config("study_chat")
  c.study.section = "laplax.study.chat"  # a module path is not a section's name
  with pytest.raises(ValueError, match=r"^study.section='laplax.study.chat': use one of "
                                       r"\['chat', 'classification', 'dino', 'lm'\]$"):
    cells.section_for(c)


def test_summary_refuses_per_sequence_counts_of_different_lengths():
  """A per-sequence count is capped at min(T - 1, d): cells measured at different lengths are
  refused in one line; the length is a condition beside the scores, not a score."""
  done = {(0, 0): {"c": 5.0, "l": 12}, (4, 0): {"c": 4.0, "l": 8.5}}
  scores = lambda cell: {"per_sequence_components_99": cell["c"], "per_sequence_length": cell["l"]}
  names = {0: "k=0", 4: "k=4"}
  with pytest.raises(ValueError, match=r"equal sequence lengths.*k=0 seed 0: T = 12, "
                                       r"k=4 seed 0: T = 8.5"):
    grid.summarize([0, 4], done, [0], names, scores)
  done[(4, 0)]["l"] = 12
  summary = grid.summarize([0, 4], done, [0], names, scores)
  row = summary["rows"][1]
  assert row["per_sequence_length"] == [12] and list(row["scores"]) == [
      "per_sequence_components_99"]
  assert row["paired_difference"]["per_sequence_components_99"][0] == -1.0


def test_classification_scores_show_top5_and_best_beside_the_verdicts_final_accuracy():
  """Top-5 and the best periodic accuracy (timm's ImageNet numbers) are scores of the table; the
  verdict compares the final step's test accuracy, and the report's setup says so."""
  from laplax.study import classification

  def cell(final, best, top5):
    return {"analysis": {"layers": [{"within_sequence": 0.5}]},
            "results": {"test": {"accuracy": final, "top5": top5,
                                 "best": {"accuracy": best, "step": 6}},
                        "val": {"accuracy": final - 0.01}}}

  done = {(0, 0): cell(0.80, 0.90, 0.95), (0, 1): cell(0.81, 0.91, 0.96),
          (4, 0): cell(0.70, 0.95, 0.97), (4, 1): cell(0.71, 0.96, 0.98)}
  summary = grid.summarize([0, 4], done, [0, 1], {0: "k=0", 4: "k=4"},
                           classification.cell_scores)
  lap = summary["rows"][1]
  assert lap["scores"]["test_accuracy"] == [0.70, 0.71]
  assert lap["scores"]["test_best_accuracy"] == [0.95, 0.96]
  assert lap["scores"]["test_top5_accuracy"] == [0.97, 0.98]
  assert lap["scores"]["val_accuracy"] == pytest.approx([0.69, 0.70])
  assert "val_best_accuracy" not in lap["scores"]  # val was not periodic here
  for key in ("test_best_accuracy", "test_top5_accuracy", "val_accuracy"):
    assert classification.scale(key) == (100.0, 2) and "(%)" in classification.label(key)
  # The final accuracy is worse, the best one better: the verdict reads the final one only.
  verdict = "\n".join(grid.verdict(summary, classification.SCORES, []))
  assert "test accuracy (%): -10.00" in verdict and "worse than the baseline" in verdict
  assert "best" not in verdict and "top-5" not in verdict
  assert classification.VERDICT_ACCURACY in classification.setup(make_config("study_vit"))
  assert "uses the final step's test accuracy" in classification.VERDICT_ACCURACY
  # A run from before top-5 and best: only the scores it has.
  old = {"analysis": {"layers": [{}]}, "results": {"test": {"accuracy": 0.5}}}
  assert classification.cell_scores(old) == {"test_accuracy": 0.5}
