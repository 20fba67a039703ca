r"""The LM study: baseline vs Laplacian GPT (lm_tiny) on the default corpus, three seeds.

  python train.py --config=configs/study_lm.py --workdir=runs/study_lm

Cells are lm_tiny runs (configs/lm_tiny.py) differing only in model.laplacian_heads and seed;
each is evaluated on the benchmarks (first `eval_limit` items) and analysed for linguistic
collapse. report.md, summary.json and spectrum.png are written to the workdir.
"""

from configs import common, lm_tiny


def get_config():
  c = common.study("study_lm", lm_tiny.get_config(), specs=(0, 2))
  c.study.eval_tasks = ["arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval", "lambada"]
  c.study.eval_limit = 100  # first N items per task (0 = all; CPU runs cannot afford all)
  c.study.data_dir = str(common.SHARED)
  c.study.analysis_windows = 256
  return c
