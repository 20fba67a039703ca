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
