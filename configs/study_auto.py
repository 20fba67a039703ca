r"""Choosing k automatically (laplax.train.auto_heads): gate heads decide per head between P V
and (I - P) V during the first fifth of training, then the mask is frozen. The default study's
data and recipe (configs/study_fmnist.py), four head settings x 3 seeds:

  nice -n 10 python train.py --config=configs/study_auto.py --workdir=runs/study_auto
  # -> runs/study_auto/report.md: scores with paired intervals vs the baseline, the geometry,
  #    and the chosen masks per seed (masks.png: P(attention) per layer and head at the freeze)

Settings: 0 (baseline), 4 (the paper's fixed k: every head Laplacian), 'auto' (gates for 300
of the 1500 steps, then each head attention where P(attention) >= 1/2, Laplacian elsewhere) and
'auto(pick=random)' (the same phase, then as many Laplacian heads as the gates chose, placed at
random from the seed: is it which heads, or how many?). 12 cells; the k = 0 and k = 4 cells are
those of configs/study_controls.py and configs/study_fmnist.py (the same runs).
"""

from configs import study_fmnist


def get_config():
  c = study_fmnist.get_config()
  c.name = "study_auto"
  c.study.laplacian_heads = [0, 4, "auto", "auto(pick=random)"]
  return c
