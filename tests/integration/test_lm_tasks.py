"""LM evaluation tasks: HumanEval in the sandbox (a Python process per program) on the first
items of the real file: the canonical solutions pass, a wrong body fails.
In-process checks of the scorers and loaders: tests/unit/test_lm_tasks.py."""


from laplax.evals.lm import tasks as lm_tasks



def test_humaneval_canonical_passes_and_wrong_fails_in_the_sandbox(shared_data):
  task = lm_tasks.HumanEval(timeout_s=20)
  items = task.load(shared_data, limit=2)
  solutions = {it.prompt: it.canonical_solution for it in items}
  good = task.evaluate(items, generate_fn=lambda ps, n: [solutions[p] for p in ps])
  assert good["accuracy"] == 1.0 and good["num_items"] == 2
  # A wrong body, followed by junk after a stop sequence that would not even parse.
  bad = task.evaluate(items, generate_fn=lambda ps, n: ["    return None\ndef (((" for _ in ps])
  assert bad["accuracy"] == 0.0 and bad["metric"] == "pass@1"
