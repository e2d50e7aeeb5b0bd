"""The benchmarks' markdown reports (stats.markdown_table) rebuilt from their committed
JSON records equal the committed reports in docs/results/."""

import json
import os

from moejax.profiling.conversion import conversion_report as large_checkpoint_report
from moejax.profiling.report import prefill_table, profile_table

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results")


def committed(name: str, text: bool = False):
  with open(os.path.join(RESULTS, name)) as f:
    return f.read() if text else json.load(f)


def table_lines(text: str) -> list[str]:
  return [line.rstrip() for line in text.splitlines() if line.startswith("|")]


def test_prefill_profile_report_is_the_committed_one():
  report = prefill_table(committed("generate_prefill_profile_cpu.json")["rows"])
  assert len(table_lines(report)) == 135
  assert report in committed("generate_prefill_profile_cpu.md", text=True)


def test_decode_profile_tables_are_the_committed_ones_with_every_row():
  rows = committed("generate_profile_cpu.json")["rows"]
  lines = table_lines(profile_table(rows))
  # generate_cpu.md was written before two labels named the prefill program too
  md = (
    committed("generate_cpu.md", text=True)
    .replace("| other in the step (", "| other in the step or prefill (")
    .replace("between the step's thunks", "between the program's thunks")
  )
  assert set(lines) <= set(table_lines(md))
  # (a) the step, (b) host and the per-token total follow the parts in every table
  for label in (
    "**(a) the step**",
    "**(b) host, outside the step**",
    "**per decode step in generate**",
  ):
    assert sum(line.startswith(f"| {label}") for line in lines) == len(rows)
  assert sum(line.startswith("| part |") for line in lines) == len(rows)


def test_large_checkpoint_report_is_the_committed_one():
  report = large_checkpoint_report(committed("large_checkpoint_cpu.json"))
  md = committed("large_checkpoint_cpu.md", text=True).replace("| --- ", "|---")
  assert len(table_lines(report)) == 11
  assert md.startswith(report + "\n")
