"""Drive an experiments/ entry point in this process, as `python -m` would.

    result = run_entry("experiments.generate", "--workdir=...", "--top_p=2")
    result.code, result.stderr, result.stdout

Every entry point defines its flags in absl's global FLAGS at import, and
several share names (--workdir), so each call first removes the flags the
previous entry point (and its config overrides) defined, then imports the
module afresh. Parsing and main go through moejax.cli exactly as cli.run does
(only absl's app.run wrapper is skipped; tests/cli/test_subprocess.py runs it).
"""

import contextlib
import dataclasses
import hashlib
import importlib
import io
import logging
import os
import sys

from absl import flags

from moejax import cli

# The model of the session's tmp area (tests/cli/conftest.py's `area`), as a --config.
TRAIN_CONFIG = "configs/lm_shakespeare_moe.py:size=tiny"

FLAGS = flags.FLAGS
_BASE_FLAGS = frozenset(FLAGS)  # absl's own and --verbose


@dataclasses.dataclass
class Result:
  code: int | str | None
  stdout: str
  stderr: str


def load_entry(module: str):
  """The entry module imported afresh into a FLAGS holding only the base flags."""
  for name in set(FLAGS) - _BASE_FLAGS:
    if name in FLAGS:  # deleting a flag also deletes its short name
      delattr(FLAGS, name)
  FLAGS.unparse_flags()
  sys.modules.pop(module, None)
  return importlib.import_module(module)


def run_entry(module: str, *args: str, parse_only: bool = False) -> Result:
  """Parse `args` and run the module's main; the exit code and captured output."""
  entry = load_entry(module)
  argv = [module, *args]
  out, err = io.StringIO(), io.StringIO()
  code = 0
  saved_argv, sys.argv = sys.argv, argv  # ml_collections reads overrides from sys.argv
  log_handler = logging.StreamHandler(err)  # log records reach stderr in a real run
  logging.getLogger().addHandler(log_handler)
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      rest = cli.parse_flags(argv)
      if not parse_only:
        cli.call(entry.main, rest)
  except SystemExit as e:
    code = e.code
  finally:
    sys.argv = saved_argv
    logging.getLogger().removeHandler(log_handler)
    FLAGS.unparse_flags()
  return Result(code, out.getvalue(), err.getvalue())


def tree_hash(root: str) -> str:
  """Hash of every path under root (directories included), file sizes and contents."""
  h = hashlib.sha256()
  for directory, dirs, files in os.walk(root):
    dirs.sort()
    h.update(f"D {os.path.relpath(directory, root)}\n".encode())
    for name in sorted(files):
      path = os.path.join(directory, name)
      h.update(f"F {os.path.relpath(path, root)} {os.path.getsize(path)}\n".encode())
      with open(path, "rb") as f:
        h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()


def assert_refused(result: Result, *names: str) -> str:
  """Non-zero exit, exactly one stderr line starting `error:` that names every `names`,
  no traceback; returns the line."""
  lines = result.stderr.splitlines()
  assert result.code not in (0, None), f"exit {result.code}; stderr: {result.stderr[-2000:]}"
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert len(lines) == 1, f"{len(lines)} stderr lines:\n{result.stderr[-3000:]}"
  assert lines[0].startswith("error: "), lines[0]
  for name in names:
    assert name in lines[0], f"{name!r} not named in: {lines[0]}"
  return lines[0]
