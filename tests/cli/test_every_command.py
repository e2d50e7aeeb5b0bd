"""Every command refuses bad values of every flag it defines: exit status 2, one line
naming the flag and no traceback, no file created or changed, nothing compiled.

Commands: every module of the experiments package (experiments/*.py) whose source
calls `cli.run(main)`, found by scanning the directory, so a command added later is
covered without editing this file. Flags: the ones the module defines in absl's
FLAGS (imported afresh by tests/cli/harness.py). Base invocation: the command's own
usage line (the first `python -m experiments.NAME ...` of its docstring, optional
[...] arguments included), with every path replaced by one of the session's tmp
area (tests/cli/conftest.py): an input workdir by its tiny training workdir, an
input HF directory by its HF export, an output by a new path in it; the bad flag then
replaces or joins it.

Bad values, by the flag's type (`bad_values`; the rules, not the code under test,
say what must be refused):
  int      '', 'abc', '2.5', '-7', '0' (unless the default is 0 or the help says
           what 0 means, '0 = ...' / '0:', or gives a range from 0, '[0, ...]')
  float    '', 'abc', 'nan', 'inf', '-0.5', '0' (unless, as for int, 0 is meant)
  bool     'maybe';  enum: an unknown name
  list     '' (unless the help says what empty means) and an unknown name
  config   a missing file
  string, by role (`role`, from the flag's name and help):
    input directory   '', a file, a missing path (a flag named *workdir or *_dir, or
                      whose help says "to read from"; a list of them: each path)
    output directory  '', a file, a path under a file; 'new or empty' in the help:
                      a non-empty directory; with the input workdir: a path inside it
    input file        '', a missing file, a directory, an empty file
    output file       '', a directory, a missing directory, a path under a file, and
                      for a figure (--plot) a format matplotlib cannot write
    anything else     '' and an unknown name
Exceptions (EXCEPTIONS) are few, each with its reason.

Unwritable outputs are paths under a regular file: the suite runs as root, for
whom no permission bit refuses a write (cli_files.output_dir's permission check is
tested by monkeypatching os.access in test_contract).

Sampling: per command, hypothesis draws MAX_PER_COMMAND of its (flag, value) cases
(derandomized: the same cases on every run and in CI; set MOEJAX_EVERY_COMMAND_ALL=1
to run all of them). A compile listener (jax.monitoring) counts XLA compilations
and stops a command that compiles, so an accepted bad value costs one trace, not
a run.
"""

import dataclasses
import os
import re
import shlex

import jax
from absl import flags
from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from tests.cli.harness import run_entry, tree_hash, load_entry, _BASE_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_PER_COMMAND = 20
ALL = os.environ.get("MOEJAX_EVERY_COMMAND_ALL") == "1"

# (command, flag, value) accepted against the rules above, and why
EXCEPTIONS = {
  ("experiments.generate", "prompt", "no_such_name"): "free text to continue",
  ("experiments.evaluate", "prefix_id", "0"): "token id 0 is a token like any other",
  ("experiments.train", "process_id", "0"): "the first process of a multi-process job",
}


# ---- compilation counter ------------------------------------------------------------------


class Compiled(Exception):
  """Raised from the listener: a command compiled an XLA program."""


@dataclasses.dataclass
class _Counter:
  armed: bool = False
  count: int = 0


COMPILES = _Counter()


def _listener(name, *_, **__):
  if COMPILES.armed and name.endswith("backend_compile_duration"):
    COMPILES.count += 1
    raise Compiled(name)


jax.monitoring.register_event_duration_secs_listener(_listener)


# ---- discovery ----------------------------------------------------------------------------


def commands(
  package_dir: str = os.path.join(ROOT, "experiments"), package: str = "experiments"
) -> list[str]:
  """Every module of `package` whose source calls cli.run(main)."""
  found = []
  for name in sorted(os.listdir(package_dir)):
    path = os.path.join(package_dir, name)
    if name.endswith(".py") and "cli.run(main)" in open(path, encoding="utf-8").read():
      found.append(f"{package}.{name[:-3]}")
  return found


@dataclasses.dataclass(frozen=True)
class Flag:
  name: str
  kind: str  # int, float, bool, enum, list, config, string
  default: object
  help: str


def flags_of(module: str) -> tuple[object, list[Flag]]:
  """The module (imported afresh) and the flags it defines."""
  entry = load_entry(module)
  found = []
  for name in sorted(set(flags.FLAGS) - _BASE_FLAGS):
    flag = flags.FLAGS[name]
    if name != flag.name or "." in name:  # a short name; a config override
      continue
    parser = type(flag.parser).__name__
    kind = (
      "config"
      if "Config" in type(flag).__name__ or "Config" in parser
      else "list"
      if isinstance(flag, flags.MultiFlag) or parser == "ListParser"
      else {
        "IntegerParser": "int",
        "FloatParser": "float",
        "BooleanParser": "bool",
        "EnumParser": "enum",
      }.get(parser, "string")
    )
    found.append(Flag(name, kind, flag.default, flag.help or ""))
  return entry, found


def role(flag: Flag) -> str:
  """in_dir, out_dir, in_file, out_file or text: a string flag's role, from its name
  and help (the conventions of experiments/)."""
  name, text = flag.name, flag.help.lower()
  named_dir = name.endswith(("workdir", "_dir")) or "to read from" in text
  a_file = re.search(r"\.(json|jsonl|npy|npz|png)\b|as json|\bfile\b", text)
  if re.search(r"\b(write|written|output|for checkpoints|lives)\b", text):
    return (
      "out_dir"
      if named_dir or (re.search(r"directory|workdir", text) and not a_file)
      else "out_file"
    )
  if named_dir:
    return "in_dir"
  return "in_file" if a_file else "text"


# ---- base invocation ----------------------------------------------------------------------


def usage(entry, module: str) -> list[str]:
  """The arguments of the first `python -m MODULE ...` line of the module's docstring
  (continued over trailing backslashes), [...] brackets removed."""
  lines = (entry.__doc__ or "").splitlines()
  for i, line in enumerate(lines):
    if f"python -m {module} " in line or line.rstrip().endswith(f"python -m {module}"):
      text = line.split(f"python -m {module}", 1)[1]
      while text.rstrip().endswith("\\") and i + 1 < len(lines):
        i += 1
        text = text.rstrip()[:-1] + " " + lines[i]
      text = text.split("#", 1)[0].replace("[", " ").replace("]", " ")
      return [a for a in shlex.split(text) if a.startswith("--")]
  return []


def base_args(entry, module: str, defined: list[Flag], area) -> list[str]:
  """The usage line with its paths replaced by the tmp area's (module doc)."""
  by_name = {f.name: f for f in defined}
  out = []
  for arg in usage(entry, module):
    name, _, value = arg[2:].partition("=")
    flag = by_name.get(name)
    if flag is not None and flag.kind == "list" and role(flag) == "in_dir":
      out.append(f"--{name}={area.train},{area.converted}")  # models of the same shapes
      continue
    if flag is None or flag.kind != "string" or role(flag) == "text":
      out.append(arg)
      continue
    kind = role(flag)
    if kind == "in_dir":
      value = area.hf if "hf" in name else area.train
    elif kind == "in_file":
      continue
    else:
      value = os.path.join(area.root, f"new_{name}{os.path.splitext(value)[1]}")
    out.append(f"--{name}={value}")
  return out


def bad_values(flag: Flag, area, base: list[str]) -> list[str]:
  """The values of `flag` that must be refused (module doc)."""
  k, text = flag.kind, flag.help
  zero_meant = flag.default == 0 or re.search(r"\b0 ?(=|:)|\[0, ", text)
  if k == "int":
    return ["", "abc", "2.5", "-7"] + ([] if zero_meant else ["0"])
  if k == "float":
    return ["", "abc", "nan", "inf", "-0.5"] + ([] if zero_meant else ["0"])
  if k == "bool":
    return ["maybe"]
  if k == "enum":
    return ["no_such_name"]
  if k == "list" and role(flag) == "in_dir":
    return ["", os.path.join(area.bad, "afile.txt"), area.missing]
  if k == "list":
    return ([] if re.search(r"\bempty\b", text, re.I) else [""]) + ["no_such_name"]
  if k == "config":
    return [area.missing + ".py"]
  afile, bad = os.path.join(area.bad, "afile.txt"), area.bad
  kind = role(flag)
  if kind == "in_dir":
    return ["", afile, area.missing]
  if kind == "out_dir":
    values = ["", afile, os.path.join(afile, "sub")]
    if "new or empty" in text:
      values.append(os.path.join(bad, "foreign"))
    if any(arg.endswith(f"={area.train}") for arg in base):  # an input workdir
      values.append(os.path.join(area.train, "inside"))
    return values
  if kind == "in_file":
    return ["", area.missing + ".npy", bad, os.path.join(bad, "empty.npy")]
  if kind == "out_file":
    values = ["", bad, os.path.join(area.missing, "sub", "x.json"), os.path.join(afile, "x.json")]
    if flag.name == "plot" or re.search(r"\b(heatmap|png)\b", text, re.I):
      values.append(os.path.join(area.root, "figure.nope"))
    return values
  return ["", "no_such_name"]


def cases(module: str, area) -> list[tuple[list[str], str, str]]:
  """(base arguments, flag, bad value) of every flag of `module`."""
  entry, defined = flags_of(module)
  base = base_args(entry, module, defined, area)
  out = []
  for flag in defined:
    for value in bad_values(flag, area, base):
      if (module, flag.name, value) not in EXCEPTIONS:
        out.append((base, flag.name, value))
  return out


# ---- the check ----------------------------------------------------------------------------


def check_refused(area, module: str, base: list[str], name: str, value: str) -> None:
  """`module base --name=value`: exit 2, one line naming --name, nothing written or
  compiled."""
  args = [a for a in base if not a.startswith(f"--{name}=")] + [f"--{name}={value}"]
  where = f"python -m {module} {' '.join(args)}"
  before = tree_hash(area.root)
  COMPILES.armed, COMPILES.count = True, 0
  try:
    result = run_entry(module, *args)
  except Compiled:
    raise AssertionError(f"compiled a program before refusing: {where}") from None
  finally:
    COMPILES.armed = False
  lines = result.stderr.splitlines()
  assert result.code == 2, f"exit {result.code}: {where}\n{result.stderr[-1500:]}"
  assert "Traceback" not in result.stderr, f"{where}\n{result.stderr[-3000:]}"
  assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}\n{result.stderr}"
  assert f"--{name}" in lines[0] or f"{name}=" in lines[0], f"{where}\n{lines[0]}"
  assert tree_hash(area.root) == before, f"files changed: {where}\n{lines[0]}"


COMMANDS = commands()


def test_every_command_is_found():
  """The scan finds the commands the README documents (a floor, not the list)."""
  assert {
    "experiments.train",
    "experiments.generate",
    "experiments.study",
    "experiments.prune",
  } <= set(COMMANDS)


@pytest.mark.parametrize("module", COMMANDS)
def test_every_flag_refuses_bad_values(area, module):
  todo = cases(module, area)
  assert todo, f"{module}: no flags found"
  if ALL:
    failures = []
    for base, name, value in todo:
      try:
        check_refused(area, module, base, name, value)
      except AssertionError as e:
        failures.append(str(e).splitlines()[0] + " | " + str(e).splitlines()[-1][:300])
    assert not failures, f"{len(failures)} of {len(todo)}:\n" + "\n".join(failures)
    return

  @settings(
    max_examples=min(MAX_PER_COMMAND, len(todo)),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
  )
  @given(st.sampled_from(todo))
  def prop(case):
    check_refused(area, module, *case)

  prop()


PLANTED = r'''r"""A planted command.

  python -m {package}._planted --count=3
"""
from absl import flags

from moejax import cli, cli_files

_COUNT = {define}


def main(argv):
  print(_COUNT.value)


if __name__ == "__main__":
  cli.run(main)
'''


@pytest.mark.parametrize(
  "define, refuses",
  [
    ('flags.DEFINE_integer("count", 3, "Items.")', False),
    ('cli.checked(flags.DEFINE_integer("count", 3, "Items."), cli.at_least(1))', True),
  ],
)
def test_a_planted_command_is_found_and_held_to_the_rules(
  area, tmp_path, monkeypatch, define, refuses
):
  """A new module that calls cli.run(main) is enumerated with its flag; one that
  accepts --count=-7 fails the check, the same module with a validator passes."""
  package = f"planted_{tmp_path.name}".replace("-", "_")
  (tmp_path / package).mkdir()
  (tmp_path / package / "__init__.py").write_text("")
  (tmp_path / package / "_planted.py").write_text(PLANTED.format(package=package, define=define))
  monkeypatch.syspath_prepend(str(tmp_path))
  assert commands(str(tmp_path / package), package) == [f"{package}._planted"]
  todo = cases(f"{package}._planted", area)
  assert {(name, value) for _, name, value in todo} == {
    ("count", v) for v in ("", "abc", "2.5", "-7", "0")
  }
  assert todo[0][0] == ["--count=3"]  # the base, from the usage line
  for base, name, value in todo:
    if refuses or value in ("", "abc", "2.5"):  # absl refuses what is not an integer
      check_refused(area, f"{package}._planted", base, name, value)
    else:
      with pytest.raises(AssertionError, match="exit 0"):
        check_refused(area, f"{package}._planted", base, name, value)
