r"""Beyond the paper, on the LM: which operator do a GPT's heads want? The LM study's model and
corpus (configs/study_lm.py, lm_tiny), five head settings x 3 seeds:

  python train.py --config=configs/study_lm_operators.py --workdir=runs/study_lm_operators
  # -> runs/study_lm_operators/report.md: validation bits per byte with paired intervals vs
  #    the baseline, linguistic collapse and spectra per operator, and the learned mix
  #    coefficients per layer and head over training (coefficients.png)

Settings (laplax.heads): 0 (every head P V), 4 (every head Laplacian), 'mix(plain)' and
'mix(laplacian)' (every head a_h V + b_h P V with learned scalars started at the plain and the
Laplacian head; no weight decay on them, the recipe's lr) and 'heat(2)' ((I - P)^2 V, causal:
two fused passes per layer). The head_coefficients evaluator records a and b every 25 steps.
Benchmarks: the two log-likelihood tasks only (arc_easy, lambada; the first 100 items), since a
1.3M-parameter model scores chance on the others and generation tasks cost most of a cell's
evaluation time. 15 cells, one per CPU core at a time (study.workers = 0).

Measured (2026-12-02, 2 cores, 75 min; a cell trains in 8-10 min), validation bits per byte
mean +- std and the paired difference vs the baseline (95 % interval):
  k = 0            1.6887 +- 0.0060
  k = 4 (all)      1.7329 +- 0.0075   +0.0442 (+0.0279, +0.0605)   worse
  mix(plain)       1.6846 +- 0.0061   -0.0040 (-0.0083, +0.0003)
  mix(laplacian)   1.7261 +- 0.0080   +0.0374 (+0.0184, +0.0564)   worse
  heat(2)          1.7045 +- 0.0134   +0.0158 (-0.0126, +0.0443)
As on Fashion-MNIST, the mix heads keep the character they start with (16/16 heads, every
seed): started plain, b ends 0.76-0.83 in layer 0 and 0.91-1.05 deeper, a -0.05 .. -0.19;
started Laplacian, b stays negative (-0.68 in layer 0, -0.92 .. -1.23 deeper) and a shrinks to
0.50 (layer 0) .. 0.84. Learning the coefficients recovers only a sixth of the Laplacian
heads' loss gap. Last-layer components for 99 % variance 113.3 -> 105.7 (k = 4), 108.3
(heat(2)): the paper's direction (it reports -21 % at 561M), -7 % here, intervals containing 0.
"""

from configs import common
from configs import study_lm


def get_config():
  c = study_lm.get_config()
  c.name = "study_lm_operators"
  c.base.evals.coefficients = common.evaluator("head_coefficients", every=25)
  c.study.laplacian_heads = [0, 4, "mix(plain)", "mix(laplacian)", "heat(2)"]
  c.study.eval_tasks = ["arc_easy", "lambada"]
  c.study.workers = 0  # one one-core cell process per CPU core
  return c
