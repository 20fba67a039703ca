"""GPU-node configs: each is a pod config (configs/pod/) as one node of 8 x H100 80 GB runs it
(`common.on_gpu_node`: cuDNN attention, bf16, the pod's global batch and recipe), with its
command on one node and on several (SLURM), and its per-GPU memory (`train.py --aot=h100:8`)."""
