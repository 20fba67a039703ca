"""Pod-scale configs: each names its target TPU topology, its command and the fit check's figures
(`train.py --aot=TOPOLOGY`, laplax.train.aot)."""
