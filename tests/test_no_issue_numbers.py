"""Docstrings and comments cite papers and equations, not the issue that asked for a
feature: an issue number means nothing to a reader of the code."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_issue_numbers_in_the_code():
  found = []
  for top in ("moejax", "experiments", "configs", "kernels"):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        if not name.endswith((".py", ".md")):
          continue
        path = os.path.join(folder, name)
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
          if re.search(r"\bissues? \d", line, flags=re.I):
            found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
  assert not found, "\n".join(found)
