"""The command-line contract shared by every entry point in experiments/.

    from moejax import cli
    _N = cli.checked(flags.DEFINE_integer("n", 3, "..."), cli.at_least(1))
    def main(argv): ...
    if __name__ == "__main__":
      cli.run(main)

A refused input (a bad flag, config key, file or workdir) exits with status 2
and prints one line on stderr, `error: <what> (<flag, key or file>=<value>)`;
`--verbose` prints the traceback too. Refused means a ConfigError (raised by
moejax code that checked its input) or an absl flags.Error (raised while
parsing, which runs the validators attached here). Anything else is a bug and
keeps its traceback. Entry points check their flags and workdirs (the
`*_workdir` helpers below) before they create, write or compile anything.
"""

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import traceback
from typing import Any, Callable

from absl import app, flags, logging

from moejax.errors import ConfigError

FLAGS = flags.FLAGS
VERBOSE = flags.DEFINE_bool("verbose", False, "On a refused input, print the traceback too.")
EXIT_REFUSED = 2

# What marks a directory as a moejax workdir of each kind.
TRAINING_MARKERS = ("checkpoints", "metrics.jsonl", "tensorboard")
CONVERTED_MARKER = os.path.join("model", "config.json")


def run(main) -> None:
  """app.run(main) with flag parsing and main held to the contract."""
  app.run(lambda argv: call(main, argv), flags_parser=parse_flags)


def parse_flags(argv: list[str]) -> list[str]:
  """FLAGS(argv) (validators included); a refused flag or config key exits with one line."""
  verbose = any(a in ("--verbose", "--verbose=true", "--verbose=1") for a in argv)
  try:
    args = FLAGS(argv)
  # absl's flags.Error for bad values; ml_collections raises KeyError/AttributeError for
  # an unknown dotted key, OSError for a config file it cannot load, and a ValueError
  # (ConfigError included) or TypeError for a value of the wrong type. Anything else
  # raised while parsing (a bug in a config file's get_config) keeps its traceback.
  except (flags.Error, KeyError, AttributeError, OSError, ValueError, TypeError) as e:
    refuse(_flag_message(e, argv), verbose=verbose)
  for name, flag in FLAGS._flags().items():  # a config file that failed to load
    value = flag.value
    if value is not None and type(value).__name__ == "_ErrorConfig":  # a deferred IOError
      try:
        value.lock()
      except OSError as e:
        filename = getattr(flag, "config_filename", "")  # ml_collections' config flag
        refuse(_config_file_message(e, f"--{name}={filename}"), verbose=verbose)
  return args


def call(main, argv: list[str]):
  """main(argv) after parse_flags; a ConfigError exits with one line."""
  if not FLAGS["verbosity"].present:  # orbax logs every save and restore at INFO
    logging.set_verbosity(logging.WARNING)
  try:
    return main(argv)
  except ConfigError as e:
    refuse(str(e), verbose=VERBOSE.value)


def refuse(message: str, *, verbose: bool) -> None:
  """Print `error: message` (one line; after the traceback with --verbose) and exit 2."""
  if verbose:
    traceback.print_exc()
  line = " ".join(message.split())
  sys.stderr.write(f"error: {line}\n")
  sys.stderr.flush()
  sys.exit(EXIT_REFUSED)


def _flag_message(error: Exception, argv: list[str]) -> str:
  """One line for an exception raised while parsing argv."""
  text = str(error).strip()
  if not isinstance(error, flags.Error):  # ml_collections: an unknown dotted config key
    words = re.findall(r"\w+", text)  # "'nope'", or "'nope'\nDid you mean \"rope\" ..."
    key = words[0] if words else text
    hint = re.search(r'Did you mean "(\w+)"', text.replace("\\", ""))
    for arg in argv:
      name, _, value = arg.lstrip("-").partition("=")
      if "." in name and key in name.split(".")[1:]:
        suggestion = f"; did you mean {hint.group(1)}?" if hint else ""
        return f"unknown config key {name.split('.', 1)[1]}{suggestion} (--{name}={value})"
    if isinstance(error, OSError):
      config_arg = next((a for a in argv if re.match(r"--?config=", a)), "--config")
      return _config_file_message(error, config_arg)
    return f"cannot parse the flags: {type(error).__name__}: {text}"
  if "\n" in text:  # a config file that raised: its last line is the exception
    text = text.splitlines()[-1]
    text = re.sub(r"^[\w.]*(ConfigError|Error): ", "", text)
    config_flag = next((a for a in argv if re.match(r"--?config=", a)), None)
    return f"{text} ({config_flag})" if config_flag else text
  required = re.match(
    r"flag --([\w.]+)=None: Flag --[\w.]+ must have a value other than None", text
  )
  if required:
    return f"a required flag is missing (--{required.group(1)})"
  match = re.match(r"flag --([\w.]+)=(.*?): (.*)$", text, re.S)
  if match:
    name, value, what = match.groups()
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    return f"{what.rstrip('.')} (--{name}={given[-1] if given else value})"
  return text


def _config_file_message(error: OSError, flag: str) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  reason = next(
    (line for line in reversed(lines) if "No such file" in line or "Error" in line),
    lines[-1] if lines else "",
  )
  return f"cannot load the config file: {reason} ({flag})"


# ---- flag validators: attached to a flag, run by parse_flags -------------------------------


def checked(holder, check, expected: str | None = None):
  """Attach `check` (a predicate, e.g. at_least(1)) to a flag; returns the flag holder.

  The predicate sees each element of a list flag, which must hold at least one
  element; None (unset) always passes."""
  expected = expected or check.expected

  def ok(value):
    values = value if isinstance(value, list) else [value]
    return value is None or all(_safe(check, v) for v in values)

  flag = FLAGS[holder.name]
  if isinstance(flag, flags.MultiFlag) or isinstance(flag.parser, flags.ListParser):
    flags.register_validator(
      holder.name, lambda v: v is None or len(v) > 0, message="expected at least one value"
    )
  flags.register_validator(holder.name, ok, message=f"expected {expected}")
  return holder


def _safe(check, value) -> bool:
  try:
    return bool(check(value))
  except (TypeError, ValueError):
    return False


def _predicate(fn, expected: str):
  fn.expected = expected
  return fn


def at_least(low, kind=int):
  """A number >= low; list elements (strings) are read with `kind`."""
  return _predicate(
    lambda v: math.isfinite(kind(v)) and kind(v) >= low,
    f"{'an integer' if kind is int else 'a finite number'} >= {low}",
  )


def in_range(low, high, *, low_open=False):
  """A number in [low, high] (or (low, high] with low_open)."""
  lo = "(" if low_open else "["
  return _predicate(
    lambda v: (
      math.isfinite(float(v))
      and float(v) <= high
      and (low < float(v) if low_open else low <= float(v))
    ),
    f"a finite number {'>' if low_open else '>='} {low}"
    if math.isinf(high)
    else f"a number in {lo}{low}, {high}]",
  )


def one_of(*names):
  return _predicate(lambda v: v in names, "one of " + ", ".join(names))


def host_port():
  return _predicate(lambda v: re.fullmatch(r"[^:\s]+:\d{1,5}", v) is not None, "HOST:PORT")


def token_ids(text: str, vocab_size: int, flag: str) -> list[int]:
  """One comma-separated list of token ids (a --prompt_ids value), each in [0, vocab_size)."""
  where = f"(--{flag}={text})"
  try:
    ids = [int(t) for t in text.replace(" ", "").split(",") if t]
  except ValueError as e:
    raise ConfigError(f"expected comma-separated integers {where}") from e
  if not ids:
    raise ConfigError(f"expected at least one token id {where}")
  bad = [i for i in ids if not 0 <= i < vocab_size]
  if bad:
    raise ConfigError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size}) {where}")
  return ids


def flag_error(holder, expected: str) -> ConfigError:
  """ConfigError `expected ... (--name=value)` for a flag whose value main refuses."""
  return ConfigError(f"{expected} (--{holder.name}={holder.value})")


# ---- files and workdirs --------------------------------------------------------------------


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
