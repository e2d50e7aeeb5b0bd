"""cli_files.output_file and cli_files.output_dir, case by case against the filesystem they see
(the permission cases by os.access, which refuses nothing to root)."""

import os

import pytest

from moejax import cli_files
from moejax.errors import ConfigError


@pytest.fixture
def tree(tmp_path):
  (tmp_path / "input").mkdir()
  (tmp_path / "input" / "weights.bin").write_bytes(b"x")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "a.txt").write_text("a")
  (tmp_path / "afile").write_text("a file")
  return tmp_path


@pytest.mark.parametrize(
  "name, kwargs, message",
  [
    ("", {}, "expected a file name"),
    ("full", {}, "expected a file name"),
    ("nowhere/out.json", {}, "nowhere does not exist"),
    ("afile/out.json", {}, "afile does not exist"),
    ("plot.nope", {"suffixes": (".png", ".pdf")}, "ending in .png, .pdf"),
    ("input/report.json", {"not_inside": [("--workdir", "input")]}, "inside the input --workdir"),
    ("input/weights.bin", {"not_inside": [("--docs", "input/weights.bin")]}, "inside the input"),
  ],
)
def test_output_file_refusals(tree, monkeypatch, name, kwargs, message):
  monkeypatch.chdir(tree)
  with pytest.raises(ConfigError, match=message) as e:
    cli_files.output_file("out", name, **kwargs)
  assert str(e.value).endswith(f"(--out={name})")


@pytest.mark.parametrize(
  "name, kwargs",
  [
    ("out.json", {}),
    ("full/a.txt", {}),
    ("plot.PNG", {"suffixes": (".png",)}),
    ("inputs.json", {"not_inside": [("--workdir", "input")]}),  # a sibling, not inside
    (None, {}),
  ],
)
def test_output_file_accepts(tree, monkeypatch, name, kwargs):
  monkeypatch.chdir(tree)
  cli_files.output_file("out", name, **kwargs)
  assert sorted(os.listdir(tree)) == ["afile", "full", "input"]  # nothing written


@pytest.mark.parametrize(
  "name, kwargs, message",
  [
    ("", {}, "expected a directory"),
    ("afile", {}, "expected a directory"),
    ("full", {"empty": True}, "new or empty"),
    ("afile/sub", {}, "afile does not exist"),
    ("nowhere/sub", {"parents": False}, "nowhere does not exist"),
    ("input/pruned", {"not_inside": [("--workdir", "input")]}, "inside the input --workdir"),
    ("input", {"not_inside": [("--workdir", "input")]}, "inside the input --workdir"),
  ],
)
def test_output_dir_refusals(tree, monkeypatch, name, kwargs, message):
  monkeypatch.chdir(tree)
  with pytest.raises(ConfigError, match=message):
    cli_files.output_dir("out", name, **kwargs)


@pytest.mark.parametrize(
  "name, kwargs",
  [
    ("new", {"empty": True}),
    ("full", {}),
    ("nowhere/deeper/sub", {}),
    ("input2", {"not_inside": [("--workdir", "input")]}),
    (None, {}),
  ],
)
def test_output_dir_accepts(tree, monkeypatch, name, kwargs):
  monkeypatch.chdir(tree)
  cli_files.output_dir("out", name, **kwargs)
  assert sorted(os.listdir(tree)) == ["afile", "full", "input"]


def test_unwritable_directories_are_refused(tree, monkeypatch):
  monkeypatch.chdir(tree)

  def writable(path, mode):
    return os.path.abspath(path) != str(tree / "full")

  monkeypatch.setattr(os, "access", writable)
  with pytest.raises(ConfigError, match=f"output directory {tree / 'full'} is not writable"):
    cli_files.output_file("json", "full/out.json")
  with pytest.raises(ConfigError, match="output directory is not writable"):
    cli_files.output_dir("out", "full")
  with pytest.raises(ConfigError, match="is not writable"):
    cli_files.output_dir("out", "full/new")


def test_plot_suffixes_are_what_matplotlib_writes(tmp_path):
  """Each listed format is written by savefig; a name outside the list is not."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  suffixes = cli_files.plot_suffixes()
  assert {".png", ".pdf", ".svg"} <= set(suffixes)
  fig = plt.figure()
  for suffix in (".png", ".pdf", ".svg", ".eps"):
    assert suffix in suffixes
    fig.savefig(tmp_path / f"f{suffix}")
  with pytest.raises(ValueError):
    fig.savefig(tmp_path / "f.nope")
  plt.close(fig)
