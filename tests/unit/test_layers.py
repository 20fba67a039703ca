"""The package's imports point one way: core -> models, data -> train -> features -> geometry ->
tasks, evals -> study -> train.py / eval.py. A module never imports one of a higher layer (not
even inside a function), modules import each other only at the top (a circle held apart by a
function-local import is still a circle), no two modules and no two packages import each other
through any chain, and the evaluator packages (one per task) import each other only as declared."""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]

# Lowest first; a module may import its own layer and the ones before it.
LAYERS = (
    ("core", ("laplax", "laplax.attention", "laplax.heads", "laplax.sharding",
              "laplax.multihost", "laplax.flops", "laplax.kernels")),
    ("models, data", ("laplax.models", "laplax.data")),
    ("train", ("laplax.train", "laplax.cli")),
    ("features", ("laplax.features",)),
    ("geometry", ("laplax.geometry",)),
    ("tasks, evals", ("laplax.tasks", "laplax.evals", "laplax.convert", "laplax.presets")),
    ("study", ("laplax.study",)),
    ("CLIs", ("train", "eval", "laplax.chat", "laplax.commands")),
)

# Function-local imports of laplax modules that are allowed, with the reason.
LAZY = {
    # --multihost: the supervisor process (laplax.supervisor) starts before the command's
    # module, and so JAX, is imported; it only watches its child
    ("laplax.commands", "laplax.commands.train"): "the supervisor imports no JAX",
    ("laplax.commands", "laplax.commands.eval"): "the supervisor imports no JAX",
}


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _layer(module: str) -> int:
  best = None
  for i, (_, prefixes) in enumerate(LAYERS):
    for p in prefixes:
      if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
        best = (i, len(p))
  assert best is not None, f"{module} is in no layer: add it to LAYERS"
  return best[0]


def _sources():
  for path in sorted((REPO / "laplax").rglob("*.py")) + [REPO / "train.py", REPO / "eval.py"]:
    yield _module_name(path), path


def _imports(path: pathlib.Path):
  """(imported laplax module, line, inside a function) for every import in the file."""
  tree = ast.parse(path.read_text())
  type_checking = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      type_checking.update(id(n) for n in ast.walk(node))
  functions = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      functions.update(id(n) for n in ast.walk(node) if n is not node)
  for node in ast.walk(tree):
    if id(node) in type_checking:
      continue
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      # `from laplax.x import y`: y may be a module or a name in x.
      names = [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
      if name.split(".")[0] == "laplax":
        yield name, node.lineno, id(node) in functions


def _resolve(name: str, modules: set[str]) -> str:
  """The module an imported name belongs to (`laplax.data.text.shards.META` ->
  laplax.data.text.shards)."""
  while name not in modules and "." in name:
    name = name.rsplit(".", 1)[0]
  return name


def _graph():
  sources = dict(_sources())
  modules = set(sources)
  edges = {}
  for module, path in sources.items():
    for name, line, lazy in _imports(path):
      target = _resolve(name, modules)
      if target != module:
        edges.setdefault(module, []).append((target, line, lazy))
  return sources, edges


def test_no_module_imports_a_higher_layer():
  _, edges = _graph()
  bad = [f"{m}:{line} imports {t} ({LAYERS[_layer(t)][0]} above {LAYERS[_layer(m)][0]})"
         for m, targets in edges.items() for t, line, _ in targets if _layer(t) > _layer(m)]
  assert not bad, "\n".join(bad)


def test_laplax_modules_are_imported_at_the_top():
  _, edges = _graph()
  bad = [f"{m}:{line} imports {t} inside a function" for m, targets in edges.items()
         for t, line, lazy in targets if lazy and (m, t) not in LAZY]
  assert not bad, "\n".join(bad) + "\n(import at the top, or add the pair to LAZY with a reason)"
  stale = [pair for pair in LAZY if pair not in {(m, t) for m, ts in edges.items()
                                                 for t, _, lazy in ts if lazy}]
  assert not stale, f"LAZY lists imports that are gone: {stale}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan)."""
  index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for v in list(graph):
    if v not in index:
      visit(v)
  return circles


def test_no_import_circles():
  _, edges = _graph()
  assert not (c := _circles({m: {t for t, _, _ in ts} for m, ts in edges.items()})), c


def _package(module: str) -> str:
  path = REPO / module.replace(".", "/")
  if (path / "__init__.py").exists() or "." not in module:
    return module
  return module.rsplit(".", 1)[0]


def _package_graph() -> dict[str, set[str]]:
  """Package -> the packages its modules import; a package and its own subpackages are one
  house (laplax.evals.dino may use a module of laplax.evals), so edges between them are left out."""
  _, edges = _graph()
  graph = {}
  for module, targets in edges.items():
    a = _package(module)
    for target, _, _ in targets:
      b = _package(target)
      if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
        graph.setdefault(a, set()).add(b)
  return graph


def test_no_package_circles():
  # Module circles are caught above; this catches two packages that lean on each other through
  # different modules (geometry -> evals.features while evals -> geometry, before
  # laplax.features).
  assert not (c := _circles(_package_graph())), c


# The evaluator packages (one per task) that may import another, and which.
EVAL_PACKAGES = ("classification", "lm", "chat", "dino")
EVAL_USES = {"laplax.evals.chat": {"laplax.evals.lm"}}


def test_evaluator_packages_import_only_what_is_declared():
  graph = _package_graph()
  packages = {f"laplax.evals.{p}" for p in EVAL_PACKAGES}
  for p in packages:
    assert (REPO / p.replace(".", "/") / "evaluators.py").exists(), f"{p} has no evaluators.py"
  bad = {p: sorted(graph.get(p, set()) & packages - EVAL_USES.get(p, set())) for p in packages}
  assert not any(bad.values()), f"undeclared imports between evaluator packages: {bad}"


def test_the_layer_map_knows_every_module():
  for module, _ in _sources():
    _layer(module)
