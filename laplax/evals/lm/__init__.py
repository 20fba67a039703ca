"""Language modelling's evaluators (evaluators.py: bpb, lm_tasks, lm_geometry; core.py: CORE over
the DCLM bundle), the benchmark tasks (tasks.py), batched greedy generation (generate.py) and
HumanEval's sandbox (sandbox.py)."""
