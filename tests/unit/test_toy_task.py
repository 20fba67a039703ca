"""Adding a task is one Task subclass, one config and one registry line, and so is adding an
evaluator: a registry refuses, in one line, a class that is not a Task (or Evaluator) subclass.
The toy task and evaluator registered at run time, through the one trainer:
tests/integration/test_toy_task.py."""


import pytest

from laplax.train import evaluator as evaluator_lib
from laplax.train import task as task_lib


def test_register_refuses_what_is_not_a_task():
  with pytest.raises(TypeError, match="not a laplax.tasks.Task subclass"):
    task_lib.register("nope", dict)
  with pytest.raises(TypeError, match="not a laplax.train.evaluator.Evaluator subclass"):
    evaluator_lib.register("nope", dict)
