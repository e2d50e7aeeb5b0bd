"""Writes docs/methods/<page>.md, one page per registered router, expert type,
dispatcher, loss, grouped matmul, prompt adapter, post-training method and study, and
docs/methods/index.md.

    .venv/bin/python scripts/method_pages.py            # write the pages
    .venv/bin/python scripts/method_pages.py --check    # exit 1 if a page is stale

What a page says comes from three places: ENTRIES in scripts/method_catalogue.py
(the paper, a one-line mechanism, what is a guess, the test, the related studies), the source (the
module docstring of the file that registers the part, the registered settings and
their defaults) and the study outputs (the first table of each results file under
docs/results/ and its plot). A registered part without an entry gets no page, so
tests/docs/test_doc_coverage.py fails until it has one.
"""

import argparse
import importlib
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from moejax.evaluation.stats import markdown_table  # noqa: E402  (after sys.path holds ROOT)

OUT = os.path.join(ROOT, "docs", "methods")
from scripts.method_catalogue import (  # noqa: E402  (after sys.path holds ROOT)
  CONFIG_KEY,
  CONTRACT_KINDS,
  ENTRIES,
  KINDS,  # noqa: F401  (tests/docs read method_pages.KINDS)
  MERGE_COMMAND,
  PAPERS,
  STUDY,
  STUDY_RESULTS,
  Entry,
)


def registries():
  """kind -> the live Registry of that kind (importing the packages registers every part)."""
  from moejax import dispatch, experts, losses, routing
  from moejax import adapters, merging
  from moejax.dispatch import grouped_matmul
  from moejax.experts import merged
  from moejax.attacks import ATTACKS
  from moejax.distill.objectives import DISTILL_METHODS

  return {
    "router": routing.ROUTERS,
    "expert type": experts.EXPERT_TYPES,
    "dispatcher": dispatch.DISPATCHERS,
    "loss": losses.LOSSES,
    "grouped matmul": grouped_matmul.GROUPED_MATMULS,
    "merged experts": merged.MERGE_RULES,
    "merge method": merging.MERGE_METHODS,
    "prompt adapter": adapters.ADAPTERS,
    "attention adapter": adapters.PROJECTION_ADAPTERS,
    "distillation method": DISTILL_METHODS,
    "attack": ATTACKS,
  }


# Study pages named otherwise than their study (a part of that name has the page).
STUDY_PAGES = {"namex": "namex_study", "mergemix": "mergemix_study"}


def study_names() -> list[str]:
  folder = os.path.join(ROOT, "configs", "studies")
  return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_"))


def posttrain_methods() -> list[str]:
  from moejax.posttrain import compress_pipeline, methods

  names = [*methods.METHODS, *compress_pipeline.METHODS, *methods.QUANTIZERS]
  return list(dict.fromkeys(names))  # kmeans is a method and the codebook quantizer


def registered() -> list[tuple[str, str]]:
  """Every (kind, name) that needs a page, from the registries, the post-training
  method lists and configs/studies/."""
  parts = [(kind, name) for kind, reg in registries().items() for name in reg]
  parts += [("post-training method", name) for name in posttrain_methods()]
  parts += [("study", name) for name in study_names()]
  return parts


def entry_of(kind: str, name: str) -> Entry | None:
  if kind == "study":
    if name not in STUDY:
      return None
    title, paper, tests = STUDY[name]
    return Entry(
      title,
      "",
      paper,
      tests=tests,
      studies=(name,),
      command=f"python -m experiments.study --config=configs/studies/{name}.py",
      page=STUDY_PAGES.get(name),
    )
  return ENTRIES.get(kind, {}).get(name)


def page_of(kind: str, name: str) -> str:
  """The page (docs/methods/<page>.md) of a part: its name unless its entry says otherwise."""
  entry = entry_of(kind, name)
  return entry.page if entry is not None and entry.page else name


# ---- what the source says


def _source_file(kind: str, name: str) -> str | None:
  """The repository path of the file that defines the part."""
  if kind == "study":
    return f"configs/studies/{name}.py"
  if kind == "post-training method":
    from moejax.posttrain import methods

    return (
      "moejax/posttrain/atoms.py"
      if name in methods.ATOM_METHODS
      else "moejax/posttrain/expert_subset.py"
      if name in methods.METHODS
      else "moejax/posttrain/quantize.py"
      if name in ("rtn", "gptq")
      else "moejax/posttrain/compress_pipeline.py"
    )
  item = registries()[kind].get(name)
  if kind == "grouped matmul":
    return "moejax/dispatch/grouped_matmul.py"
  fn = next(
    (getattr(item, a) for a in ("fn", "route", "expert", "build", "objective") if hasattr(item, a)),
    item,
  )
  module = inspect.getmodule(fn)
  return os.path.relpath(module.__file__, ROOT) if module else None


def _module_doc(path: str) -> str:
  import ast

  with open(os.path.join(ROOT, path)) as f:
    return ast.get_docstring(ast.parse(f.read())) or ""


def _grouped_matmul_doc(name: str) -> str:
  """The paragraph of grouped_matmul.py's module docstring that describes `name`."""
  lines, out = _module_doc("moejax/dispatch/grouped_matmul.py").splitlines(), []
  for line in lines:
    if line.startswith(f"  '{name}'"):
      out = [line.strip()]
    elif out and line.startswith("      ") and not line.strip().startswith("'"):
      out.append(line.strip())
    elif out:
      break
  return "\n".join(out)


def _settings(kind: str, name: str) -> list[tuple[str, object]]:
  if kind == "merged experts":
    from moejax.experts import merged

    return list(merged.SETTINGS.defaults)
  if kind in ("dispatcher", "grouped matmul"):  # the PartSettings it declares, or None
    return list(getattr(registries()[kind].get(name).settings, "defaults", ()))
  if kind not in (
    "router",
    "expert type",
    "loss",
    "merge method",
    "prompt adapter",
    "attention adapter",
  ):
    return []
  item = registries()[kind].get(name)
  return list(dict(getattr(item, "settings", None) or {}).items())


def _section(kind: str, name: str) -> str:
  if kind == "prompt adapter":
    return f"model.vit.prompt.{name}"
  if kind == "attention adapter":
    return f"model.attention.{name}"
  if kind == "merged experts":
    return "model.moe.merged"
  if kind in ("dispatcher", "grouped matmul"):
    return f"model.moe.{registries()[kind].get(name).settings.path}"
  return f"model.moe.losses.{name}" if kind == "loss" else f"model.moe.{name}"


def _study_description(name: str) -> str:
  module = importlib.import_module(f"moejax.configs.studies.{name}")
  config = module.get_config()
  return " ".join(str(config.get("description", "")).split())


def _command(kind: str, name: str, entry: Entry) -> str:
  if entry.command:
    return entry.command
  train = "python -m experiments.train --config=configs/lm_shakespeare_moe.py --workdir=runs/x"
  if kind == "loss":
    return f"{train} \\\n    --config.model.moe.loss_weights.{name}=1e-2"
  if kind in CONFIG_KEY:
    return f"{train} \\\n    --config.{CONFIG_KEY[kind]}={name}"
  if kind == "merge method":
    return MERGE_COMMAND.format(name=name)
  from moejax.posttrain import methods

  if name in methods.METHODS:
    return f"python -m experiments.prune --workdir=DIR --method={name} --keep=0.5 --out=OUT"
  return f"python -m experiments.compress --workdir=DIR --method={name} --level=LEVEL --out=OUT"


# ---- results


def _first_table(path: str) -> tuple[str | None, list[str]]:
  """The heading above the first markdown table of a results file, and the table."""
  heading, table = None, []
  with open(path) as f:
    for line in f:
      line = line.rstrip("\n")
      if line.startswith("|"):
        table.append(line)
      elif table:
        break
      elif line.startswith("#"):
        heading = line.lstrip("#").strip()
  return heading, table


def _plot_of(path: str) -> str | None:
  stem = path[:-3]
  for candidate in (
    os.path.join(os.path.dirname(path), "results.png"),
    stem + "_curves.png",
    stem + ".png",
  ):
    if os.path.basename(path) != "results.md" and candidate.endswith("results.png"):
      continue
    if os.path.exists(candidate):
      return candidate
  return None


def _results(studies, extra) -> list[str]:
  files = []
  for study in studies:
    default = os.path.join("studies", study, "results.md")
    for rel in (default,) + STUDY_RESULTS.get(study, ()):
      if os.path.exists(os.path.join(ROOT, "docs", "results", rel)):
        files.append(rel)
  files += [rel for rel in extra if os.path.exists(os.path.join(ROOT, "docs", "results", rel))]
  out = []
  for rel in dict.fromkeys(files):
    path = os.path.join(ROOT, "docs", "results", rel)
    heading, table = _first_table(path)
    link = "../results/" + rel
    out.append(f"From [`docs/results/{rel}`]({link})" + (f", *{heading}*:" if heading else ":"))
    out.append("")
    if table:
      out += table + [""]
    plot = _plot_of(path)
    if plot:
      rel_plot = os.path.relpath(plot, os.path.join(ROOT, "docs", "results"))
      out += [f"![results plot of {rel}](../results/{rel_plot})", ""]
  return out


# ---- pages


def _paper_line(key: str | None) -> str:
  if key is None:
    return (
      "None: a baseline, an engineering part or our own check; no paper claims are tested here."
    )
  title, venue, arxiv = PAPERS[key]
  link = (
    f" ([arXiv {arxiv}](https://arxiv.org/abs/{arxiv}))"
    if arxiv
    else " (no arXiv version; abstract only)"
  )
  return f"*{title}*, {venue}{link}."


def render_entry(kind: str, name: str, level: str = "##") -> list[str]:
  entry = entry_of(kind, name)
  source = _source_file(kind, name)
  out = [f"{level} Paper", "", _paper_line(entry.paper), "", f"{level} Mechanism", ""]
  if kind == "study":
    description = _study_description(name).replace("<", "&lt;").replace(">", "&gt;")
    out += [description or "(The config gives no description.)", ""]
  else:
    out += [entry.summary, ""]
  doc = (
    _grouped_matmul_doc(name)
    if kind == "grouped matmul"
    else ("" if kind == "study" else _module_doc(source))
  )
  if doc:
    out += [f"From the source (`{source}`):", "", "```text", doc.strip(), "```", ""]
  out += [
    f"{level} What is a guess",
    "",
    entry.guess
    if kind != "study"
    else "The claims table marks each claim from our own spec, not the paper, as ours.",
    "",
  ]
  out += [f"{level} Config", ""]
  if kind == "study":
    out += [f"The study is `configs/studies/{name}.py` (arms, levels, draws, claims).", ""]
  elif kind in CONFIG_KEY:
    key = f"{CONFIG_KEY[kind]}.{name}" if kind == "loss" else f"{CONFIG_KEY[kind]}={name}"
    out += [f"Chosen by `{key}`" + (" (the loss's weight)." if kind == "loss" else "."), ""]
    settings = _settings(kind, name)
    if settings:
      rows = [[f"`{_section(kind, name)}.{k}`", f"`{v!r}`"] for k, v in settings]
      out += [
        f"Its settings, in `{_section(kind, name)}`:",
        "",
        markdown_table(["key", "default"], rows),
        "",
      ]
    else:
      out += ["It has no settings of its own.", ""]
  elif kind == "merge method":
    settings = _settings(kind, name)
    out += [
      f"A `--method` of `experiments.merge` (`{source}`)"
      + (
        ", with the flags " + ", ".join(f"`--{k}` (default `{v!r}`)" for k, v in settings)
        if settings
        else ", with no settings of its own"
      )
      + ".",
      "",
    ]
  else:
    out += [f"A `--method` of the post-training commands (`{source}`).", ""]
  out += [f"{level} Command", "", "```bash", _command(kind, name, entry), "```", ""]
  out += [f"{level} Test", ""]
  for test in entry.tests:
    if not os.path.exists(os.path.join(ROOT, test)):
      raise SystemExit(f"error: {kind} {name!r} names a test that does not exist ({test})")
    out.append(f"- `{test}`")
  if kind in CONTRACT_KINDS:
    out.append("- `tests/contract/` (every registered part, iterated from the registries)")
  out += ["", f"{level} Results", ""]
  results = _results(entry.studies, entry.results)
  out += results or [
    "No study output yet: nothing under `docs/results/` shows this part on its own.",
    "",
  ]
  return out


def pages() -> dict[str, str]:
  """page -> markdown, for every registered part that has an entry."""
  by_page: dict[str, list[tuple[str, str]]] = {}
  for kind, name in registered():
    if entry_of(kind, name) is not None:
      by_page.setdefault(page_of(kind, name), []).append((kind, name))
  out = {}
  for page, parts in sorted(by_page.items()):
    lines = [f"# {entry_of(*parts[0]).title}", ""]
    lines += ["Registered as " + ", ".join(f"{k} `{n}`" for k, n in parts) + ".", ""]
    if len(parts) == 1:
      lines += render_entry(*parts[0])
    else:
      for kind, name in parts:
        lines += [f"## The {kind} `{name}`: {entry_of(kind, name).title}", ""]
        lines += render_entry(kind, name, level="###")
    out[page] = "\n".join(lines).rstrip() + "\n"
  rows = [
    [kind, f"[`{name}`]({page_of(kind, name)}.md)", entry_of(kind, name).title]
    for kind, name in registered()
    if entry_of(kind, name) is not None
  ]
  out["index"] = "\n".join(
    [
      "# Methods",
      "",
      "One page per registered router, expert type, dispatcher, loss, grouped matmul,",
      "prompt adapter, attention adapter,",
      "post-training method and study: its paper, mechanism, what is a guess, config,",
      "command, test and results. Written by `scripts/method_pages.py` from the",
      "registries, the source and the study outputs under `docs/results/`.",
      "",
      markdown_table(["kind", "name", "what"], rows),
      "",
    ]
  )
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if a written page differs")
  args = parser.parse_args(argv)
  stale = []
  written = pages()
  for page, text in written.items():
    path = os.path.join(OUT, page + ".md")
    old = open(path).read() if os.path.exists(path) else None
    if old != text:
      stale.append(path)
      if not args.check:
        os.makedirs(OUT, exist_ok=True)
        with open(path, "w") as f:
          f.write(text)
  if args.check and stale:
    print("stale: " + ", ".join(os.path.relpath(p, ROOT) for p in stale), file=sys.stderr)
    return 1
  print(f"{len(written)} pages" + (", all current" if args.check else f", {len(stale)} rewritten"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
