"""DINO's evaluators of the frozen teacher (evaluators.py) and their protocols: k-NN (knn.py),
linear probes in memory (linear_probe.py) and streamed (stream_linear.py), per-patch segmentation
(segmentation.py), ADE20K's linear protocol (ade20k.py), the probes of one teacher (probes.py)."""
