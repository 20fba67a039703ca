"""Baseline-vs-Laplacian studies: a grid of head specs x seeds of ordinary runs, one report.

grid.py runs the grid and writes the report skeleton (verdict, score tables with paired
intervals); stats.py holds the paired statistics; each task's section module
(cells.SECTIONS, by the base task: classification.py, lm.py, dino.py; chat.py for
pipelines of stages) says what a cell measures, which scores and geometric claims to compare,
and adds its own tables and figures; coefficients.py adds the learned mix-head coefficients to
the classification and LM reports. sweep.py runs one study per model depth (study.depths: the
authors' depth x heads x seed sweep) and writes their results.csv. head_switches.py scores
every single-head switch of one trained classifier at evaluation (which heads matter).
"""
