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

Measured (the 2 shared cores, two one-core cells at a time), test accuracy (%) mean +- std
over seeds 0-2, paired difference (95 % t-interval), last-layer geometry:
  heads                 accuracy         vs k = 0               within-seq. between-cl. comps 99%
  k = 0                 87.86 +- 0.19                           0.843       0.077       49.7
  k = 4                 87.67 +- 0.34    -0.19 (-0.71, +0.34)   0.849       0.088       47.7
  auto                  87.31 +- 0.09    -0.55 (-0.85, -0.25)   0.721       0.190       46.7
  auto(pick=random)     87.13 +- 0.47    -0.73 (-1.61, +0.16)   0.730       0.178       46.0
  auto - k = 4: -0.36 (-1.00, +0.27); auto - auto(pick=random): +0.18 (-0.79, +1.15) accuracy,
  -0.009 (-0.059, +0.041) within-seq., +0.013 (-0.027, +0.053) between-class.
Chosen masks (L = Laplacian, layers 0-3): seed 0 ...L/..../..L./.L.. (3), seed 1
...L/..L./.LL./.... (4), seed 2 ..../..../L..L/..L. (3): the gates make about a fifth of the
heads Laplacian, the seeds agree on 8/16 heads (what three independent masks of that density
agree on: 0.8^3 + 0.2^3 = 52 %), and the choice is no better than a random mask of the same
size. The geometry moves (within-sequence fraction -0.12, between-class +0.11, both intervals
excluding 0) for the chosen and the random masks alike, and not for k = 4: it goes with the
gate phase and the mask's size, not with which heads (why a few Laplacian heads after the phase
move it and all of them do not: not investigated). At this scale the gates choose nothing
better than chance, and the run loses 0.55 points against k = 0 (during the phase: 76.3 % vs
80.9 % at step 250).
Cost: a gate-phase step is 1.047x [0.990-1.096] a k = 4 step (benchmarks/vit_step_bench.py
--patch=7 --heads auto), so a run is about 1.01x a fixed-k run plus one more step compile.
"""

from configs import study_fmnist


def get_config():
  c = study_fmnist.get_config()
  c.name = "study_auto"
  c.study.laplacian_heads = [0, 4, "auto", "auto(pick=random)"]
  return c
