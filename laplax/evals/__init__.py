"""Evaluators: what a run measures, picked by `type` from config.evals (base class and registry:
laplax.train.evaluator.TYPES).

One subpackage per task; each has its registered evaluators in `evaluators.py` and their
building blocks beside it:
  classification/  accuracy, vit_geometry (+ accuracy.py: the sharded correct-count pass)
  lm/              bpb, lm_tasks, lm_geometry (+ bpb.py, tasks.py: ARC, MMLU, GSM8K, HumanEval,
                   LAMBADA; generate.py: batched greedy decoding; sandbox.py: HumanEval's
                   isolated process, which base models (lm_tasks) and chat models both use)
  chat/            chat (+ engine.py: generation with the calculator tool; calculator.py)
  dino/            dino_probes, dino_transfer, horse, ade20k, photo_pca,
                   dino_spectra (+ probes, knn, linear_probe, stream_linear, ade20k,
                   segmentation, online_head)
chat builds on lm (its benchmarks are lm's tasks in chat format); no other subpackage imports
another. The modules here serve every task: mechanism.py (mechanism), attention_maps.py
(attention_maps), coefficients.py (head_coefficients), reading any task that is a
laplax.train.task.Subject (laplax.train.analysis: the model and batches they measure), and
offline.py (eval.py's work on a checkpoint or an export).
Feature passes and PCA are laplax.features (below laplax.geometry, which draws their figures).
"""
