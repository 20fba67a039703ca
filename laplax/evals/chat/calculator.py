"""The chat model's calculator tool: nanochat's `use_calculator` (engine.py, commit ae0bf52)
without `eval`.

nanochat accepts two kinds of expression (after removing every comma):
  * pure arithmetic: only the characters 0-9 + - * / . ( ) and spaces, and no '**';
  * a string method call: letters, digits, quotes, ( ) . _ and spaces, containing '.count('
    ('strawberry'.count('r')), none of a list of dangerous names.
It evaluates them with Python's eval and prints `str(result)`; anything that fails gives None.

Here the same inputs are parsed with `ast` and walked by a restricted evaluator: numbers, + - *
/ (true division), unary + -, parentheses, and `'literal'.count('literal')`. Everything else
(names, calls, attributes, `**`, subscripts) is refused, and so are expressions longer than
MAX_CHARS, numbers of magnitude above MAX_MAGNITUDE (inputs and every intermediate result: no
`9*9*9*...` blow-up) and division by zero. The result is what nanochat prints: `str` of the
Python value ('3' for 1+2, '10.0' for 20/2, '3' for a count).
"""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 256
MAX_MAGNITUDE = 1e15

_ARITH_CHARS = set("0123456789*+-/.() ")
_STRING_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ ")
# nanochat's refusal list for string expressions (kept so the two accept the same inputs).
_DANGEROUS = ("__", "import", "exec", "eval", "compile", "open", "file", "input", "raw_input",
              "globals", "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}


class _Refused(Exception):
  """The expression is outside what the calculator evaluates."""


def _check(value):
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise _Refused
  if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
    raise _Refused
  return value


def _arith(node: ast.AST):
  if isinstance(node, ast.Constant):
    return _check(node.value)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    value = _arith(node.operand)
    return _check(-value if isinstance(node.op, ast.USub) else value)
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left, right = _arith(node.left), _arith(node.right)
    if isinstance(node.op, ast.Div) and right == 0:
      raise _Refused
    return _check(_BINARY[type(node.op)](left, right))
  raise _Refused


def _count(node: ast.AST) -> int:
  """'literal'.count('literal') and nothing else."""
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "count" and not node.keywords and len(node.args) == 1):
    raise _Refused
  target, arg = node.func.value, node.args[0]
  if not all(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in (target, arg)):
    raise _Refused
  return target.value.count(arg.value)


def use_calculator(expr: str) -> str | None:
  """`expr` (the text between <|python_start|> and <|python_end|>) -> the printed result, or
  None where nanochat's calculator gives none (or where a limit here refuses it)."""
  expr = expr.replace(",", "")
  if len(expr) > MAX_CHARS or not expr.strip():
    return None
  if set(expr) <= _ARITH_CHARS:
    if "**" in expr:
      return None
    kind = _arith
  else:
    if not set(expr) <= _STRING_CHARS or any(p in expr.lower() for p in _DANGEROUS) \
        or ".count(" not in expr:
      return None
    kind = _count
  try:
    tree = ast.parse(expr.strip(), mode="eval")
    return str(kind(tree.body))
  except (_Refused, SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
    return None
