"""Language modelling's evaluators (evaluators.py: bpb, lm_tasks, lm_geometry), the benchmark
tasks (tasks.py), batched greedy generation (generate.py) and HumanEval's sandbox (sandbox.py)."""
