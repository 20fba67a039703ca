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
all (identity) until the class token is read. 15 cells.
"""

from configs import study_fmnist


def get_config():
  c = study_fmnist.get_config()
  c.name = "study_controls"
  c.study.laplacian_heads = [0, 4, "uniform", "centering", "identity"]
  return c
