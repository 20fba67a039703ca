r"""The authors' architecture at CPU scale: baseline vs half the heads Laplacian, three seeds,
validation bits per byte and CORE (the offline five-task bundle), the paper's LM spectra.

  python scripts/core_bundle.py --dest=runs/core_bundle      # ARC-E/C, PIQA, WinoGrande, LAMBADA
  python train.py --config=configs/study_lm_fork.py --workdir=runs/study_lm_fork \
      --config.base.evals.core.bundle=runs/core_bundle --config.base.evals.core.final=True

Cells: lm_tiny's data, size and length (depth 4, width 128, 4 heads of 32, 400 steps x 16 x 256
tokens) with every part of the fork's default model (yuchongzhang/nanochat at 1f70b557; value
embeddings, residual and x0 scalars, smear, backout, windows 'SSSL' of 128 / 256 keys, rotary
base 100000, q/k scale 1.2, its init) and its optimiser and schedule (optim.name 'nanochat': the
fork's MuonAdamW, warm-up 40 steps, warm-down over the last 65 % to 0.05). The recipe's horizon
and batch are off (target_param_data_ratio 0): at 12 tokens per parameter this model would
train on 5M tokens, and the Power Lines batch is sized for GPUs. k = 0 vs 2 of 4 heads (the
paper's 5 of 10 at d20). CORE: every task's first 200 rows (the pod sweep: all).

Measured: benchmarks/README.md "The fork's architecture on CPU".
"""

from configs import common, lm_tiny


def get_config():
  b = lm_tiny.get_config()
  b.name = "lm_fork_tiny"
  fork = common.gpt_fork_model(4)
  with b.model.ignore_type():
    for key in ("use_ve", "use_resid_lambdas", "use_x0", "use_smear", "use_backout",
                "window_pattern", "rope_theta", "qk_scale", "rope_table_dtype", "init"):
      b.model[key] = fork[key]
  b.model.sequence_len = b.data.get_ref("seq_len")
  b.optim = common.nanochat_optim(target_param_data_ratio=0.0)
  b.optim.nanochat.distributed = False  # one CPU device: nothing to share
  b.evals.core.max_per_task = 200
  b.evals.core.batch_size = 32
  c = common.study("study_lm_fork", b, specs=(0, 2), seeds=(1, 2, 3))  # the fork's seeds
  c.study.eval_tasks = []
  c.study.eval_limit = 0
  c.study.data_dir = ""
  c.study.analysis_windows = 256
  c.study.workers = 2
  return c
