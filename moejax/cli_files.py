"""The files and workdirs an entry point reads and writes, checked before any work
(moejax/cli.py has the rest of the command-line contract): which kind a workdir is,
that an input exists, that an output can be written without clobbering an input,
.jsonl inputs read line by line with each bad line named, and the --json/--markdown/
--plot outputs a study or benchmark writes. A refusal is a ConfigError naming the flag.
"""

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

from absl import flags

from moejax.cli import flag_error
from moejax.errors import ConfigError

# What marks a directory as a moejax workdir of each kind.
TRAINING_MARKERS = ("checkpoints", "metrics.jsonl", "tensorboard")
CONVERTED_MARKER = os.path.join("model", "config.json")


def workdir_kind(path: str) -> str:
  """'missing', 'file', 'empty', 'training', 'converted', 'mixed' or 'foreign'."""
  if not os.path.exists(path):
    return "missing"
  if not os.path.isdir(path):
    return "file"
  entries = os.listdir(path)
  if not entries:
    return "empty"
  training = any(name in entries for name in TRAINING_MARKERS)
  converted = os.path.isfile(os.path.join(path, CONVERTED_MARKER))
  if training and converted:
    return "mixed"
  return "training" if training else "converted" if converted else "foreign"


KIND_WORDS = {
  "training": "a training run (checkpoints/)",
  "converted": "an imported model (model/config.json)",
  "mixed": "a training run and an imported model",
}


def existing_workdir(flag: str, path: str, kinds=("training", "converted", "mixed")) -> str:
  """The kind of a workdir to read from; ConfigError unless it is one of `kinds`."""
  return checked_workdir(f"--{flag}", path, kinds)


def checked_workdir(key: str, path: str, kinds=("training", "converted", "mixed")) -> str:
  """existing_workdir for any key that names the path ('--workdir', 'study.settings.workdir')."""
  kind = workdir_kind(path)
  where = f"({key}={path})"
  if kind == "missing":
    raise ConfigError(f"workdir does not exist {where}")
  if kind == "file":
    raise ConfigError(f"workdir is a file, not a directory {where}")
  if kind in ("empty", "foreign"):
    raise ConfigError(f"not a moejax workdir: no checkpoints/ or model/config.json {where}")
  if kind not in kinds:
    want = " or ".join(KIND_WORDS[k] for k in kinds)
    raise ConfigError(f"workdir holds {KIND_WORDS[kind]}; this command needs {want} {where}")
  return kind


def one_source(workdir_flag, hf_flag) -> str:
  """Exactly one of a --workdir-like and an --hf_dir-like flag, naming an existing
  source; returns the workdir's kind (workdir_kind) or 'hf'."""
  if (workdir_flag.value is None) == (hf_flag.value is None):
    raise ConfigError(
      f"give exactly one of --{workdir_flag.name} and --{hf_flag.name} "
      f"(--{workdir_flag.name}={workdir_flag.value}, "
      f"--{hf_flag.name}={hf_flag.value})"
    )
  if workdir_flag.value is not None:
    return existing_workdir(workdir_flag.name, workdir_flag.value)
  if not os.path.isdir(hf_flag.value):
    raise flag_error(hf_flag, "expected an existing HF checkpoint directory")
  return "hf"


def writable_workdir(flag: str, path: str, kind: str, *, allow_mixed: bool = False) -> None:
  """Refuse to write `kind` ('training' or 'converted') into a workdir holding anything else.

  New and empty directories are fine, as is the same kind (a resumed run); the
  other kind only with --allow_mixed."""
  found = workdir_kind(path)
  where = f"(--{flag}={path})"
  if found == "file":
    raise ConfigError(f"workdir is a file, not a directory {where}")
  if found == "foreign":
    raise ConfigError(
      f"directory is not empty and not a moejax workdir; use a new or empty one {where}"
    )
  if found in ("missing", "empty", kind) or allow_mixed:
    return
  raise ConfigError(
    f"workdir already holds {KIND_WORDS[found]}; writing "
    f"{KIND_WORDS[kind]} there too needs --allow_mixed {where}"
  )


def output_file(
  flag: str, path: str | None, *, suffixes=(), not_inside=(), key: str | None = None
) -> None:
  """Refuse an output file that cannot be written as asked, before any work: a directory,
  a directory that is missing or not writable, a name not ending in one of `suffixes`
  (e.g. plot_suffixes()), or a path inside one of `not_inside` (input paths)."""
  if path is None:
    return
  where = f"({key or '--' + flag}={path})"
  if path == "" or os.path.isdir(path):
    raise ConfigError(f"expected a file name, not a directory {where}")
  if suffixes and not path.lower().endswith(tuple(suffixes)):
    raise ConfigError(
      f"cannot write this format; expected a name ending in {', '.join(suffixes)} {where}"
    )
  _writable(os.path.dirname(os.path.abspath(path)), where, parents=False)
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise ConfigError(f"output file is not writable {where}")
  _not_inside(path, not_inside, where)


def output_dir(
  flag: str,
  path: str | None,
  *,
  empty: bool = False,
  parents: bool = True,
  not_inside=(),
  key: str | None = None,
) -> None:
  """Refuse an output directory that cannot be written as asked, before any work: a file,
  not empty (with `empty`), a parent that is missing (unless `parents`: the command
  creates it) or not writable, or a path inside one of `not_inside` (input paths)."""
  if path is None:
    return
  where = f"({key or '--' + flag}={path})"
  if path == "" or (os.path.exists(path) and not os.path.isdir(path)):
    raise ConfigError(f"expected a directory, not a file {where}")
  if os.path.isdir(path):
    if empty and os.listdir(path):
      raise ConfigError(f"expected a new or empty directory {where}")
    if not os.access(path, os.W_OK | os.X_OK):
      raise ConfigError(f"output directory is not writable {where}")
  else:
    _writable(os.path.dirname(os.path.abspath(path)), where, parents=parents)
  _not_inside(path, not_inside, where)


def _writable(parent: str, where: str, *, parents: bool) -> None:
  """The directory an output is created in: it exists (or, with `parents`, its nearest
  existing ancestor is a directory) and can be written."""
  while parents and not os.path.exists(parent) and os.path.dirname(parent) != parent:
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f"output directory {parent} does not exist {where}")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f"output directory {parent} is not writable {where}")


def _not_inside(path: str, inputs, where: str) -> None:
  real = os.path.realpath(path)
  for name, source in inputs:
    if source and (real + os.sep).startswith(os.path.realpath(source) + os.sep):
      raise ConfigError(f"output is inside the input {name}={source}; write it elsewhere {where}")


def plot_suffixes() -> tuple[str, ...]:
  """The file name endings matplotlib can write (its savefig formats)."""
  from matplotlib.backend_bases import FigureCanvasBase

  return tuple(sorted("." + s for s in FigureCanvasBase.get_supported_filetypes()))


def undo_new_workdir(path: str, before: str) -> None:
  """Remove what a refused run wrote into a workdir that was 'missing' or 'empty' before."""
  if before in ("missing", "empty") and os.path.isdir(path):
    shutil.rmtree(path)
    if before == "empty":
      os.makedirs(path)


def input_file(flag: str, path: str) -> None:
  """Refuse a missing, non-regular or empty input file."""
  if not os.path.exists(path):
    raise ConfigError(f"file does not exist (--{flag}={path})")
  if not os.path.isfile(path):
    raise ConfigError(f"not a file (--{flag}={path})")
  if os.path.getsize(path) == 0:
    raise ConfigError(f"file is empty (--{flag}={path})")


def json_lines(flag: str, path: str, fields: tuple[str, ...]):
  """(where, record) of each non-blank line of the .jsonl input file `path`, every
  record a JSON object whose `fields` are strings; `where` names the flag, file and
  line. ConfigError (one line, naming them) on an empty file, a line that is not
  JSON, or a missing or non-string field."""
  input_file(flag, path)
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"(--{flag}={path}, line {number})"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ConfigError(f"not a JSON line: {e} {where}") from None
      if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in fields):
        shape = ", ".join(f'"{k}": str' for k in fields)
        raise ConfigError(f"expected {{{shape}}} {where}")
      yield where, record


@dataclasses.dataclass(frozen=True)
class StudyOutputs:
  """A study or benchmark CLI's --json, --markdown and --plot (None: no --plot):
  checked before any work (`check`), written at the end (`write`)."""

  json: Any
  markdown: Any
  plot: Any = None

  def check(self) -> None:
    output_file(self.json.name, self.json.value)
    output_file(self.markdown.name, self.markdown.value)
    if self.plot is not None:
      output_file(self.plot.name, self.plot.value, suffixes=plot_suffixes())

  def write(self, record: dict, text: str, plot: Callable[[str], None] | None = None) -> None:
    """record -> --json (indented), text -> --markdown, plot(path) -> --plot."""
    if self.json.value:
      with open(self.json.value, "w") as f:
        json.dump(record, f, indent=1)
    if self.markdown.value:
      with open(self.markdown.value, "w") as f:
        f.write(text.rstrip("\n") + "\n")
    if self.plot is not None and self.plot.value and plot is not None:
      plot(self.plot.value)


def study_outputs(plot: bool = True) -> StudyOutputs:
  """Define --json, --markdown and (plot=True) --plot; a module calls this once."""
  return StudyOutputs(
    flags.DEFINE_string("json", None, "Write the settings and results here (JSON)."),
    flags.DEFINE_string("markdown", None, "Write the tables here."),
    flags.DEFINE_string("plot", None, "Write the figure here (PNG).") if plot else None,
  )
