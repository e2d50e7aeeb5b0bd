"""Writes docs/reference/config.md: every key of moejax.config.base_config() with
its default and the comment beside it in moejax/config.py, then every registered
router's, expert type's, loss's, dispatcher's, grouped matmul's and merge rule's own
settings section (and the shared expert's and the routing section), and the names each
choosing key accepts.

    .venv/bin/python scripts/config_reference.py           # write the page
    .venv/bin/python scripts/config_reference.py --check   # exit 1 if it is stale

tests/docs/test_config_reference.py runs --check, so the page cannot go stale.
"""

import argparse
import ast
import operator
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from moejax.evaluation.stats import markdown_table  # noqa: E402  (after sys.path holds ROOT)

OUT = os.path.join(ROOT, "docs", "reference", "config.md")
CONFIG_PY = os.path.join(ROOT, "moejax", "config.py")


def flatten(node, prefix=""):
  """(dotted key, value) for every leaf of a ConfigDict, in insertion order."""
  import ml_collections

  for key, value in node.items(preserve_field_references=True) if hasattr(node, "items") else []:
    path = f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      yield from flatten(value, path + ".")
    else:
      yield path, value


def source_comments() -> dict[str, str]:
  """dotted key -> the comment on its assignment line in base_config, or the block
  of comment lines right above it (aliases such as `m = c.model` are followed)."""
  with open(CONFIG_PY) as f:
    source = f.read()
  tree = ast.parse(source)
  fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "base_config")
  lines = source.splitlines()
  alias = {"c": ""}
  out = {}

  def dotted(expr) -> str | None:
    if isinstance(expr, ast.Name):
      return alias.get(expr.id)
    if isinstance(expr, ast.Attribute):
      base = dotted(expr.value)
      return None if base is None else (f"{base}.{expr.attr}" if base else expr.attr)
    return None

  for stmt in fn.body:
    if not isinstance(stmt, ast.Assign):
      continue
    first = stmt.targets[0]
    targets = first.elts if isinstance(first, ast.Tuple) else [first]
    keys = [dotted(t) for t in targets]
    for t in stmt.targets[1:]:  # c.model = m = ConfigDict(): m aliases model
      if isinstance(t, ast.Name) and keys[0] is not None:
        alias[t.id] = keys[0]
    comment = ""
    line = lines[stmt.lineno - 1]
    if "#" in line:
      comment = line.split("#", 1)[1].strip()
    above, i = [], stmt.lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
      above.insert(0, lines[i].strip().lstrip("#").strip())
      i -= 1
    # '<' and '>' in a comment ("validation_<domain>") are text, not HTML.
    text = (
      " ".join(above + ([comment] if comment else [])).replace("<", "&lt;").replace(">", "&gt;")
    )
    for key in keys:
      if key:
        out[key] = text
  return out


def section_notes(keys, comments: dict[str, str]) -> list[str]:
  """One bullet per section among `keys`' parents that has a comment in the source."""
  parents = dict.fromkeys(
    ".".join(k.split(".")[:n]) for k in keys for n in range(1, len(k.split(".")))
  )
  return [f"- `{p}`: {comments[p]}" for p in parents if comments.get(p)]


def fmt(value) -> str:
  text = repr(value)
  if "FieldReference" in text or "placeholder" in text:
    text = "None (unset)"
  return f"`{text}`"


def render() -> str:
  from moejax import config as cfg_module
  from moejax import dispatch, experts, losses, routing
  from moejax.dispatch import grouped_matmul
  from moejax.experts import merged
  from moejax.layers import moe as moe_layer
  from moejax.models import MODELS

  base = cfg_module.base_config()
  comments = source_comments()
  part_paths = {f"model.moe.{p.path}" for p in cfg_module.parts_with_settings()}
  sections, rows = {}, []
  for key, value in flatten(base):
    top = "model.moe" if key.startswith("model.moe.") else key.split(".")[0] if "." in key else ""
    if any(key.startswith(p + ".") for p in part_paths):
      continue  # a part's own settings: listed with the part below
    sections.setdefault(top, []).append([f"`{key}`", fmt(value), comments.get(key, "")])
  out = [
    "# Config reference",
    "",
    "Every key of `moejax/config.py: base_config()`, the one config schema every",
    "config in `configs/` starts from. Override any of them with `--config.KEY=VALUE`;",
    "`moejax/validation.py` refuses unknown keys and bad values before anything is",
    "built. Written by `scripts/config_reference.py` from the code (the defaults,",
    "the comments beside them, the registries); a test fails when this page is stale.",
    "",
    f"{sum(len(v) for v in sections.values())} keys in the schema, and "
    f"{len(part_paths)} part sections below.",
    "",
  ]
  for top, rows in sorted(sections.items()):
    notes = section_notes([r[0].strip("`") for r in rows], comments)
    out += [f"## `{top}`" if top else "## Top level", ""]
    out += notes + [""] if notes else []
    out += [markdown_table(["key", "default", "what"], rows), ""]
  declared = operator.attrgetter("settings")  # a dispatcher's or matmul's PartSettings or None
  registries = [
    ("Routers", routing.ROUTERS, "model.moe.{}"),
    ("Expert types", experts.EXPERT_TYPES, "model.moe.{}"),
    ("Losses", losses.LOSSES, "model.moe.losses.{}"),
    ("Dispatchers", dispatch.DISPATCHERS, declared),
    ("Grouped matmuls", grouped_matmul.GROUPED_MATMULS, declared),
    ("Merged experts", merged.MERGE_RULES, "model.moe.merged"),
    ("Models", MODELS, None),
  ]
  out += [
    "## Registered parts and their settings",
    "",
    "A part is chosen by name; its own settings live in its section, created at the",
    "defaults the part declares (moejax/registry.py). Each name links to its method page.",
    "",
  ]
  for title, registry, section in registries:
    rows = []
    for name, item in registry.items():
      if callable(section):
        part = section(item)
        settings = dict(part.defaults) if part else {}
        where = f"`model.moe.{part.path}`" if part else "-"
      else:
        settings = dict(getattr(item, "settings", None) or {}) if section else {}
        where = f"`{section.format(name)}`" if settings else "-"
      values = ", ".join(f"`{k}={v!r}`" for k, v in settings.items()) or "-"
      link = f"[`{name}`](../methods/{name}.md)" if title != "Models" else f"`{name}`"
      rows.append([link, where, values])
    out += [
      f"### {title} (`{registry.config_key}`)",
      "",
      markdown_table(["name", "settings section", "settings (defaults)"], rows),
      "",
    ]
  out += [
    "### The routing keys (`model.moe.routing`)",
    "",
    "Not a registered part: the routing keys more than one router or the MoE layer "
    "reads (moejax/routing/base.py, ROUTING); routers read them from their RouterConfig.",
    "",
    markdown_table(
      ["key", "default", "what"],
      [
        [f"`model.moe.routing.{key}`", fmt(default), what]
        for key, (default, what) in routing.base.ROUTING_KEYS.items()
      ],
    ),
    "",
  ]
  shared = moe_layer.SHARED
  out += [
    "### The shared expert (`model.moe.shared`)",
    "",
    "Not a registered part: the MoE layer's dense SwiGLU beside the routed experts "
    "(moejax/layers/moe.py).",
    "",
    markdown_table(
      ["settings section", "settings (defaults)"],
      [[f"`model.moe.{shared.path}`", ", ".join(f"`{k}={v!r}`" for k, v in shared.defaults)]],
    ),
    "",
  ]
  return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
  args = parser.parse_args(argv)
  text = render()
  old = open(OUT).read() if os.path.exists(OUT) else None
  if args.check:
    if old != text:
      print(
        f"stale: {os.path.relpath(OUT, ROOT)} (run scripts/config_reference.py)", file=sys.stderr
      )
      return 1
    print("docs/reference/config.md is current")
    return 0
  os.makedirs(os.path.dirname(OUT), exist_ok=True)
  with open(OUT, "w") as f:
    f.write(text)
  print(f"wrote {os.path.relpath(OUT, ROOT)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
