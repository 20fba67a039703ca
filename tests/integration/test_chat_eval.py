"""Chat evaluation's HumanEval in the sandbox (a Python process per program): the first item's
canonical solution passes, a reply without it fails.
In-process checks of the same module: tests/unit/test_chat_eval.py."""



from laplax.evals.chat import evaluators as chat_eval



def test_humaneval_canonical_solution_passes_in_the_sandbox(shared_data):
  (item,) = chat_eval.load_items("humaneval", shared_data, limit=1)
  reply = item["messages"][1]["content"]  # prompt + canonical solution
  run = chat_eval.lm_tasks.sandbox_runner()
  assert run(chat_eval.humaneval_program(item, f"```python\n{reply}\n```"))
  assert not run(chat_eval.humaneval_program(item, "def nothing(): pass"))
