"""Chat evaluation (evaluators.py: chat): lm's benchmark tasks in chat format, generation with
the calculator tool (engine.py, calculator.py)."""
