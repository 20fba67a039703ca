"""Things picked by name from a config (tasks, evaluators, a study's report sections), imported
on first use: a run imports only what it names.

A Registry is a dict of name -> "module:attr" (or "module": the module itself), or the object
once imported or registered at run time; `load(name)` gives the object (a one-line ValueError
naming the known names for an unknown one, or what to use instead for a name that is `gone`),
`register(name, obj)` adds one (a TypeError for an object that is not a subclass of `base`).

No heavy imports: configs import modules that hold registries.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


class Registry(dict):
  """name -> "module:attr" | "module" | the object (see the module docstring)."""

  def __init__(self, kind: str, entries: Mapping[str, Any] = (), *, base: type | None = None,
               base_name: str = "", unknown: str = "{kind} {name!r}; choose one of {known}",
               gone: Mapping[str, str] | None = None):
    """kind: what the names name, for messages (e.g. 'evaluator type'); base: the class every
    registered object must subclass (named base_name in the TypeError; default: its
    module and name); unknown: the message for an unknown name (a format of
    kind, name and known, the sorted names); gone: names that were, with what to use now."""
    super().__init__(entries)
    self.kind, self.base, self.unknown = kind, base, unknown
    self.base_name = base_name or (f"{base.__module__}.{base.__qualname__}" if base else "")
    self.gone = dict(gone or {})

  def register(self, name: str, obj: Any) -> None:
    """Adds (or replaces) `obj` under `name`."""
    if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
      raise TypeError(f"{obj!r} is not a {self.base_name} subclass")
    self[name] = obj

  def load(self, name: str) -> Any:
    """The object registered as `name`, imported on first use (one-line ValueErrors)."""
    if name in self.gone:
      raise ValueError(f"{self.kind} {name!r} is gone: {self.gone[name]}")
    if name not in self:
      raise ValueError(self.unknown.format(kind=self.kind, name=name, known=sorted(self)))
    entry = self[name]
    if isinstance(entry, str):
      module, _, attr = entry.partition(":")
      entry = importlib.import_module(module)
      entry = self[name] = getattr(entry, attr) if attr else entry
    return entry
