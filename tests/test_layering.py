"""No import runs upward (issue 12): the parts (routing, dispatch, losses,
experts) import no layer, model or tool; layers import no model; models
import no trainer or tool; inference and interop do not import each other.
Function-local imports count too. Read from the source with ast."""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "moejax")
PARTS = ("routing", "dispatch", "losses", "experts")
TOOLS = ("train", "inference", "interop", "analysis", "posttrain", "evaluation", "cli", "data")
FORBIDDEN = {
    **{part: ("layers", "models") + TOOLS for part in PARTS},
    # L3 (layers/lookup.py) reads the corpus to allocate its table rows
    "layers": ("models",) + tuple(t for t in TOOLS if t != "data"),
    "models": TOOLS,
    "inference": ("interop",),
    "interop": ("inference",),
}


def moejax_imports(path: str) -> set[str]:
  """The moejax subpackages a module imports (moejax.X.* -> X), anywhere in it."""
  with open(path) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
             else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
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
  bad = [f"{module} imports moejax.{target}" for module, target in edges(package)
         if target in FORBIDDEN[package]]
  assert not bad, bad


def test_the_check_sees_a_function_local_upward_import(tmp_path):
  path = tmp_path / "m.py"
  path.write_text("def f():\n  from moejax.layers.moe import MoELayer\n")
  assert moejax_imports(str(path)) == {"layers"}
