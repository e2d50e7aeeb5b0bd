"""The notebooks in notebooks/: stored without outputs, equal to what
notebooks/build.py writes from notebooks/src/, and executed top to bottom in a
Jupyter kernel (nbclient) in a temporary directory, each within its time budget.

Executing them takes minutes, so those tests carry the `notebooks` marker:
scripts/test.sh deselects them and .ci/run runs them as their own step
(`bash scripts/test.sh -m notebooks`; MOEJAX_NOTEBOOK_OUT=DIR keeps the executed
copies, outputs and all, in DIR). A failure names the notebook, the cell
(index and source) and the error; test_a_broken_cell_... shows that it does.
"""

import importlib.util
import os
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
# Seconds each notebook may take, kernel start excluded: ~3x what it takes on 2
# idle CPU cores, for CI machines shared with other jobs.
BUDGET_S = {
  "01_quickstart": 600,
  "02_routers": 900,
  "03_real_checkpoints": 600,
  "04_post_training": 900,
  "05_kernels_and_sharding": 600,
}


def load_build():
  spec = importlib.util.spec_from_file_location(
    "notebook_build", os.path.join(NOTEBOOKS, "build.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class NotebookFailed(AssertionError):
  pass


def execute(nb, cwd: str, budget_s: float, name: str) -> float:
  """Run every cell of `nb` in a fresh kernel with working directory `cwd`; the
  seconds it took. Raises NotebookFailed naming the failing cell and its error,
  or the cell that was running when `budget_s` (counted from the first cell) ran out."""
  deadline = []

  def timeout(cell):
    if not deadline:
      deadline.append(time.monotonic() + budget_s)
    return max(1, int(deadline[0] - time.monotonic()))

  client = NotebookClient(
    nb, timeout_func=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}}
  )
  start = time.monotonic()
  try:
    client.execute()
  except CellTimeoutError:
    index, cell = running_cell(nb, client)
    raise NotebookFailed(
      f"{name}: cell {index} ran past the notebook's budget of {budget_s:.0f} s:\n{cell.source}"
    ) from None
  except CellExecutionError as error:
    index, cell = failed_cell(nb)
    raise NotebookFailed(
      f"{name}: cell {index} failed:\n{cell.source}\n---\n{error.ename}: {error.evalue}"
    ) from None
  return time.monotonic() - start


def failed_cell(nb):
  """(index, cell) of the first code cell with an error output."""
  for index, cell in enumerate(nb.cells):
    if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
      return index, cell
  raise AssertionError("nbclient reported an error that no cell holds")


def running_cell(nb, client):
  """(index, cell) of the cell nbclient was executing when it timed out: the last
  code cell given an execution count."""
  ran = [
    i
    for i, cell in enumerate(nb.cells)
    if cell.cell_type == "code" and cell.get("execution_count") is not None
  ]
  index = ran[-1] if ran else 0
  return index, nb.cells[index]


def notebook_paths():
  return sorted(os.path.join(NOTEBOOKS, f) for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb"))


def test_the_five_notebooks_are_stored_without_outputs_as_build_writes_them():
  build = load_build()
  paths = notebook_paths()
  assert [os.path.basename(p)[:-6] for p in paths] == list(BUDGET_S)
  assert [dst for _, dst in build.pairs()] == paths
  for src, dst in build.pairs():
    nb = nbformat.read(dst, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code), dst
    with open(dst) as f:
      assert f.read() == build.text_of(src), f"{dst} differs from {src}: python notebooks/build.py"
    setup = code[0].source  # the set-up cell comes first: Colab install, device detection
    assert "REPO_URL = " in setup and "google.colab" in setup, dst
    assert "jax.default_backend()" in setup, dst


def test_a_percent_source_becomes_markdown_setup_and_code_cells():
  build = load_build()
  cells = build.cells_of(
    "# %% [markdown]\n# # Title\n# text\n\n# %% [setup]\nA = 1\n\n# %%\nprint(A)\n"
  )
  assert [c["cell_type"] for c in cells] == ["markdown", "code", "code"]
  assert cells[0]["source"] == "# Title\ntext"
  assert "A = 1\nimport jax" in cells[1]["source"]  # before jax is first imported
  assert cells[2]["source"] == "print(A)"
  with pytest.raises(ValueError, match="unknown cell marker"):
    build.cells_of("# %% [raw]\nx\n")


def tiny_notebook(*sources):
  return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def test_a_broken_cell_fails_the_test_naming_the_cell_and_its_error(tmp_path):
  nb = tiny_notebook(
    "x = 1",
    "y = x + 1\nraise ValueError(f'deliberately broken at {y}')",
    "open('never_written', 'w')",
  )
  with pytest.raises(NotebookFailed) as failure:
    execute(nb, str(tmp_path), 120, "broken.ipynb")
  message = str(failure.value)
  assert message.startswith("broken.ipynb: cell 1 failed:\ny = x + 1\n"), message
  assert "ValueError: deliberately broken at 2" in message, message
  assert not (tmp_path / "never_written").exists()  # execution stopped at the broken cell


@pytest.mark.integration
@pytest.mark.notebooks
@pytest.mark.parametrize("name", list(BUDGET_S))
def test_notebook_runs_top_to_bottom(name, tmp_path):
  nb = nbformat.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"), as_version=4)
  try:
    seconds = execute(nb, str(tmp_path), BUDGET_S[name], f"{name}.ipynb")
  finally:
    keep = os.environ.get("MOEJAX_NOTEBOOK_OUT")  # a folder for the executed copies
    if keep:
      os.makedirs(keep, exist_ok=True)
      nbformat.write(nb, os.path.join(keep, f"{name}.ipynb"))
  print(f"NOTEBOOK {name}: {seconds:.0f} s")
