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
15 cells. Measured (2026-12-01; 43 min on 2 cores shared with test and compile jobs), test
accuracy mean +- std and the paired difference vs the baseline (95 % interval):
  k = 0            87.87 +- 0.30
  k = 4 (all)      87.63 +- 0.16   -0.24 (-0.60, +0.12)
  mix(plain)       87.99 +- 0.08   +0.12 (-0.46, +0.71)
  mix(laplacian)   87.71 +- 0.35   -0.16 (-1.78, +1.47)
  heat(2)          87.84 +- 0.24   -0.03 (-1.36, +1.30)
No operator is distinguishable from the baseline at this scale. The mix heads stay in the basin
they start in (every seed, every head): started plain, b stays near 1 and a drifts to -0.04 ..
-0.12 (deeper layers more); started Laplacian, b grows to -1.14 .. -1.38 and a shrinks to
0.62 .. 0.73 within the first ~300 steps. heat(2) makes the tokens of an image less alike
(within-sequence variance fraction 0.833 -> 0.916, cosine 0.165 -> 0.089; between-class
fraction 0.086 -> 0.039): the first two are opposite to the directions the paper reports for
Laplacian heads, with intervals excluding 0.
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
