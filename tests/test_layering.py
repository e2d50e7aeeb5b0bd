"""The import graph of moejax is a DAG, and no import runs upward.

Read from the source with ast, function-local imports included, over every
module under moejax/ (configs/ and kernels/ through their links). `from X import
name` counts as importing the submodule X.name where one exists, else X; the
implicit import of a parent package's __init__ is not an edge.

Cycles: none between files, none between packages (moejax.X.* is package X, a
top-level module moejax.X its own package). Upward imports: assignment (the
Routing and row layouts) imports no part; the parts (routing, dispatch, losses,
experts) import no layer, model or tool; layers import no model; models import
no trainer or tool; inference and interop do not import each other.
"""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "moejax")
PARTS = ("routing", "dispatch", "losses", "experts")
TOOLS = ("train", "inference", "interop", "analysis", "posttrain", "evaluation", "cli", "data")
FORBIDDEN = {
  # the Routing and row layouts below every part
  "assignment": PARTS + ("layers", "models") + TOOLS,
  **{part: ("layers", "models") + TOOLS for part in PARTS},
  # L3's table rows come from data/l3_allocation.py, passed in: layers read no data
  "layers": ("models",) + TOOLS,
  "models": TOOLS,
  "inference": ("interop",),
  "interop": ("inference",),
}


def module_files(root: str = ROOT) -> dict[str, str]:
  """{dotted module name: path} of every .py under `root` (named as the package
  `root` is, links followed)."""
  top = os.path.basename(os.path.normpath(root))
  out = {}
  for dirpath, _, files in os.walk(root, followlinks=True):
    for name in files:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, name), root)[:-3].split(os.sep)
        parts = [top] + (rel[:-1] if rel[-1] == "__init__" else rel)
        out[".".join(parts)] = os.path.join(dirpath, name)
  return out


def imported_names(path: str, module: str, is_package: bool) -> list[str]:
  """Every dotted name the file imports, anywhere in it (relative imports resolved);
  `from X import a` gives X.a (the caller resolves it to X when X.a is no module)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  package = module if is_package else module.rpartition(".")[0]
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      names += [f"{base}.{a.name}" for a in node.names]
  return names


def import_graph(root: str = ROOT) -> dict[str, set[str]]:
  """{module: the modules of the package it imports} (see the module doc)."""
  files = module_files(root)
  graph = {}
  for module, path in files.items():
    targets = set()
    for name in imported_names(path, module, path.endswith("__init__.py")):
      while name and name not in files:
        name = name.rpartition(".")[0]
      if name and name != module:
        targets.add(name)
    graph[module] = targets
  return graph


def package_of(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  out = {}
  for module, targets in graph.items():
    out.setdefault(package_of(module), set()).update(
      package_of(t) for t in targets if package_of(t) != package_of(module)
    )
  return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan), sorted."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in sorted(graph.get(node, ())):
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        top = stack.pop()
        on_stack.discard(top)
        component.append(top)
        if top == node:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return sorted(out)


def check_acyclic(root: str = ROOT) -> None:
  """AssertionError naming every cycle between files or packages under `root`,
  with the imports that close it (for packages, one per pair and how many)."""
  graph = import_graph(root)
  problems = []
  for component in cycles(graph):
    edges = [f"{m} -> {t}" for m in component for t in sorted(graph[m]) if t in component]
    problems.append(f"cycle between files {component}: " + "; ".join(edges))
  for component in cycles(package_graph(graph)):
    pairs = {}
    for module, targets in sorted(graph.items()):
      for target in sorted(targets):
        a, b = package_of(module), package_of(target)
        if a != b and a in component and b in component:
          pairs.setdefault((a, b), []).append(f"{module} -> {target}")
    edges = [
      f"{a} -> {b} ({found[0]}{f', +{len(found) - 1}' if len(found) > 1 else ''})"
      for (a, b), found in sorted(pairs.items())
    ]
    problems.append(f"cycle between packages {component}: " + "; ".join(edges))
  assert not problems, "\n".join(problems)


def test_no_import_cycle():
  check_acyclic()


def test_a_planted_cycle_fails(tmp_path):
  root = tmp_path / "moejax"
  for package, source in (
    ("a", "def f():\n  from moejax.b.y import g\n"),
    ("b", "from moejax.a import x\n"),
  ):
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / ("x.py" if package == "a" else "y.py")).write_text(source)
  (root / "__init__.py").write_text("")
  with pytest.raises(AssertionError) as failure:
    check_acyclic(str(root))
  message = str(failure.value)
  assert "cycle between files ['moejax.a.x', 'moejax.b.y']" in message
  assert "cycle between packages ['a', 'b']" in message


def test_the_graph_resolves_submodules_and_relative_imports(tmp_path):
  root = tmp_path / "moejax"
  (root / "p").mkdir(parents=True)
  for path, source in (
    ("__init__.py", ""),
    ("p/__init__.py", "from .q import name\n"),
    ("p/q.py", "name = 1\n"),
    ("r.py", "from moejax.p import q, name\nimport moejax.p.q\n"),
  ):
    (root / path).write_text(source)
  graph = import_graph(str(root))
  assert graph["moejax.p"] == {"moejax.p.q"}
  assert graph["moejax.r"] == {"moejax.p.q", "moejax.p"}


LINKED = ("configs", "kernels")  # moejax/configs and moejax/kernels link to these


def top_level_linked_imports(root: str) -> list[str]:
  """Imports of `configs` or `kernels` by their top-level names in the .py files under
  `root`: the same files then load as two module objects (also as moejax.X)."""
  bad = []
  for dirpath, _, files in os.walk(root, followlinks=True):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        with open(path) as f:
          tree = ast.parse(f.read())
        for node in ast.walk(tree):
          names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
          )
          bad += [
            f"{os.path.relpath(path, root)}:{node.lineno} imports {n}"
            for n in names
            if n and n.split(".")[0] in LINKED
          ]
  return bad


@pytest.mark.parametrize("area", ["moejax", "tests", "experiments", "scripts", "notebooks"])
def test_one_import_name_for_configs_and_kernels(area):
  root = os.path.join(os.path.dirname(__file__), "..", area)
  assert top_level_linked_imports(root) == []


def test_the_name_check_sees_a_top_level_import(tmp_path):
  (tmp_path / "t.py").write_text("def f():\n  from kernels import gmm\n")
  assert top_level_linked_imports(str(tmp_path)) == ["t.py:2 imports kernels"]


def moejax_imports(path: str) -> set[str]:
  """The moejax subpackages a module imports (moejax.X.* -> X), anywhere in it."""
  with open(path) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    names = (
      [a.name for a in node.names]
      if isinstance(node, ast.Import)
      else [node.module]
      if isinstance(node, ast.ImportFrom) and node.module
      else []
    )
    for name in names:
      parts = name.split(".")
      if parts[0] == "moejax" and len(parts) > 1:
        found.add(parts[1])
      if isinstance(node, ast.ImportFrom) and name == "moejax":
        found.update(a.name for a in node.names)
  return found


def edges(package: str) -> list[tuple[str, str]]:
  out = []
  for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        out += [(os.path.relpath(path, ROOT), target) for target in moejax_imports(path)]
  return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_import(package):
  bad = [
    f"{module} imports moejax.{target}"
    for module, target in edges(package)
    if target in FORBIDDEN[package]
  ]
  assert not bad, bad


def test_the_check_sees_a_function_local_upward_import(tmp_path):
  path = tmp_path / "m.py"
  path.write_text("def f():\n  from moejax.layers.moe import MoELayer\n")
  assert moejax_imports(str(path)) == {"layers"}
