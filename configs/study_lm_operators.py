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
