"""Evaluators and what they measure with.

The evaluators (picked by `type` from config.evals; base class and registry:
`laplax.train.evaluator`): classification.py (accuracy, ViT geometry), lm.py (bits per byte,
benchmark tasks, LM geometry), dino.py (probes, transfer, segmentation, PCA, spectra). Their
building blocks: accuracy, bpb, lm_tasks (+ generate, sandbox), probes (+ knn, linear_probe,
segmentation, pca, features); offline.py is eval.py's work (exports: laplax.train.export).
"""
