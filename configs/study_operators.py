r"""Beyond the paper: which operator do heads want? The default study's data and recipe
(configs/study_fmnist.py), five head settings x 3 seeds:

  python train.py --config=configs/study_operators.py --workdir=runs/study_operators
  # -> runs/study_operators/report.md: scores with paired intervals vs the baseline, the
  #    geometry directions the paper reports for each operator, and the learned mix
  #    coefficients per layer and head over training (coefficients.png)

Settings (laplax.heads): 0 (baseline: every head P V), 4 (every head Laplacian, (I - P) V),
'mix(plain)' and 'mix(laplacian)' (every head a_h V + b_h P V with learned scalars, started at
the plain and at the Laplacian head; the recipe's AdamW at its lr, no weight decay on them) and 'heat(2)' ((I - P)^2 V: two fused passes per layer). The
head_coefficients evaluator records a and b at every checkpoint step (every 125 steps).
15 cells; see the closing note of issue 24 for the measured table (about 25 min on 2 cores).
"""

from configs import common
from configs import study_fmnist


def get_config():
  c = study_fmnist.get_config()
  b = c.base
  b.checkpoint.every_steps = 125  # the coefficient picture's and learning curve's points
  b.checkpoint.keep = 12
  b.evals.coefficients = common.evaluator("head_coefficients", every=125)
  c.name = "study_operators"
  c.study.laplacian_heads = [0, 4, "mix(plain)", "mix(laplacian)", "heat(2)"]
  return c
