r"""Is the Laplacian head's effect its softmax, or only the mean it removes? The default study's
data and recipe (configs/study_fmnist.py), five head settings x 3 seeds:

  nice -n 10 python train.py --config=configs/study_controls.py --workdir=runs/study_controls
  # -> runs/study_controls/report.md: scores with paired intervals vs the baseline and the
  #    geometry directions the paper reports, per setting

Settings (laplax.heads), every head of every layer: 0 (baseline, P V), 4 (Laplacian,
(I - P) V), and three controls that need no softmax: 'uniform' (U V, the mean of the values
over the keys: what a Laplacian head removes when P is uniform), 'centering' ((I - U) V, the
values minus that mean) and 'identity' (V: no mixing over tokens). With every head a control,
the model's tokens exchange information only through the mean (uniform, centering) or not at
all (identity: the class token never sees the patches, so the classifier is at chance by
construction: a floor). 15 cells.

Measured (89 min on the 2 shared cores, two one-core cells at a time, other developers' jobs
beside it), last layer, mean +- std over seeds 0-2, paired difference vs k = 0 (95 % t-interval):
  heads       test accuracy (%)                       components for 99 % of variance
  k = 0       87.86 +- 0.19                           49.7
  k = 4       87.67 +- 0.34   -0.19 (-0.71, +0.34)    47.7   -2.0 (-4.5, +0.5)
  uniform     84.31 +- 0.17   -3.55 (-4.29, -2.82)    42.3   -7.3 (-10.2, -4.5)
  centering   84.38 +- 0.52   -3.48 (-4.31, -2.66)    36.7  -13.0 (-18.0, -8.0)
  identity    10.00 +- 0.00  -77.86 (-78.34, -77.38)   8.7  -41.0 (-45.3, -36.7)
  heads       within-sequence variance fraction       between-class variance fraction
  k = 0       0.843                                   0.077
  k = 4       0.849  +0.007 (-0.082, +0.096)          0.088  +0.011 (-0.074, +0.096)
  uniform     0.820  -0.023 (-0.079, +0.034)          0.121  +0.044 (+0.006, +0.082)
  centering   0.894  +0.051 (+0.044, +0.059)          0.068  -0.009 (-0.017, +0.000)
  identity    0.873  +0.030 (-0.050, +0.110)          0.049  -0.028 (-0.084, +0.028)
The softmax is what the heads need: without it (uniform, centering) accuracy drops 3.5 points,
while the Laplacian head, which keeps P, is indistinguishable from the baseline. The controls
move the paper's geometric signatures further than the Laplacian head does (components for 99 %
fall by 7 and 13, and uniform raises the between-class fraction), at a clear cost in accuracy:
at this scale those signatures are produced by removing or averaging the sequence mean with no
attention at all, so they are not evidence that the Laplacian head helps. Centering raises the
within-sequence fraction (opposite to the paper). 28 comparisons, about 1.4 would exclude 0 by
chance. The class-token NC1 of the identity model is degenerate (its class token is the same
for every image).
"""

from configs import study_fmnist


def get_config():
  c = study_fmnist.get_config()
  c.name = "study_controls"
  c.study.laplacian_heads = [0, 4, "uniform", "centering", "identity"]
  return c
