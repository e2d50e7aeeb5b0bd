"""The lint settings (pyproject.toml, run by scripts/lint.sh) hold no blanket
ignores, and every per-line ignore names its codes and says why."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKED = ("moejax", "kernels", "configs", "scripts", "experiments", "tests", "notebooks")
# `# noqa: E402  (reason)` / `# noqa: BLE001 - reason`: codes, then words.
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)")
NOQA_WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+[-(—#]*\s*\w")
# `# type: ignore[code]  # reason`
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)")
TYPE_IGNORE_WITH_REASON = re.compile(r"\[[a-z-]+(,\s*[a-z-]+)*\]\s*#\s*\w")
FILE_LEVEL = re.compile(
  r"#\s*(ruff:\s*noqa|mypy:\s*ignore-errors|type:\s*ignore\s*$|pyink:\s*disable)"
)


def python_files():
  for top in CHECKED:
    yield from (p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def unexplained(lines, pattern, with_reason):
  return [
    n for n, line in lines if (m := pattern.search(line)) and not with_reason.match(m.group("rest"))
  ]


def test_every_per_line_ignore_names_its_codes_and_a_reason():
  bad = []
  for path in python_files():
    numbered = list(enumerate(path.read_text().splitlines(), 1))
    for n in unexplained(numbered, NOQA, NOQA_WITH_REASON):
      bad.append(f"{path.relative_to(ROOT)}:{n}: noqa without codes and a reason")
    for n in unexplained(numbered, TYPE_IGNORE, TYPE_IGNORE_WITH_REASON):
      bad.append(f"{path.relative_to(ROOT)}:{n}: type: ignore without [code] and '# reason'")
    first_lines = numbered[:5]
    bad += [
      f"{path.relative_to(ROOT)}:{n}: file-level ignore"
      for n, line in first_lines
      if FILE_LEVEL.search(line) and line.lstrip().startswith("#")
    ]
  assert not bad, "\n".join(bad)


def test_the_settings_ignore_no_rule_and_no_file():
  settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
  lint = settings["ruff"]["lint"]
  assert not {"ignore", "extend-ignore", "per-file-ignores", "extend-per-file-ignores"} & set(lint)
  assert set(lint["select"]) >= {"E", "F", "W"}
  mypy = settings.get("mypy", {})
  assert not mypy.get("ignore_errors") and "disable_error_code" not in mypy
  assert all(not o.get("ignore_errors") for o in mypy.get("overrides", []))


def test_the_checker_catches_an_unexplained_ignore():
  lines = [
    (1, "import os  # " + "noqa"),
    (2, "import re  # " + "noqa: F401"),
    (3, "import sys  # " + "noqa: F401  (re-exported)"),
    (4, "x = f()  # " + "type: ignore"),
    (5, "y = g()  # " + "type: ignore[arg-type]  # stub lacks __buffer__"),
  ]
  assert unexplained(lines, NOQA, NOQA_WITH_REASON) == [1, 2]
  assert unexplained(lines, TYPE_IGNORE, TYPE_IGNORE_WITH_REASON) == [4]
