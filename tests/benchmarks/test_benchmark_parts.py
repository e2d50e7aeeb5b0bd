"""The benchmarks' library parts (moejax/profiling/): the compressed expert report rebuilt
from its committed records, the all_to_all byte count of an HLO text, the group size
rule, and the one-line refusals of a bad size or shape."""

import json
import math
import os

import pytest

from moejax import cli
from moejax.errors import ConfigError
from moejax.profiling import compressed_experts, expert_parallel, moe_layer

RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results")


def table_lines(text: str) -> list[str]:
  return [line.rstrip() for line in text.splitlines() if line.startswith("|")]


def test_compressed_experts_tables_are_the_committed_ones():
  with open(os.path.join(RESULTS, "compressed_experts_cpu.json")) as f:
    run = json.load(f)
  with open(os.path.join(RESULTS, "compressed_experts_cpu.md")) as f:
    committed = f.read()
  settings = compressed_experts.Settings(None, 32, 0.5, reps=7, min_rep_ms=20.0, max_inner=200)
  lines = table_lines(compressed_experts.markdown(run["records"], run["command"], settings))
  assert len(lines) == len(run["records"]) + 2 * 2  # a header and a rule per size
  assert lines == table_lines(committed)[: len(lines)]


def test_all_to_all_bytes_counts_every_result_of_every_exchange():
  hlo = "\n".join(
    [
      "%a = f32[4,8]{1,0} all-to-all(f32[4,8]{1,0} %x), replica_groups={}",
      "%b = (bf16[2,3]{1,0}, s32[5]{0}) all-to-all-start(%y, %z)",
      "%c = f32[1000]{0} add(f32[1000]{0} %p, f32[1000]{0} %q)",  # no exchange
      "%d = pred[] all-to-all(pred[] %w)",  # a scalar: one element
    ]
  )
  assert expert_parallel.all_to_all_bytes(hlo) == 4 * 32 + 2 * 6 + 4 * 5 + 1


@pytest.mark.parametrize("most", [1, 7, 32, 100])
def test_group_size_is_the_largest_common_divisor_up_to_most(most):
  for d in (1, 12, 96, 128, 130):
    for f in (1, 18, 64, 256, 390):
      want = max(g for g in range(1, most + 1) if math.gcd(d, f) % g == 0)
      assert compressed_experts.group_size(d, f, most) == want


SIZES = ({"large": (512, 1024, 8, 2)}, "d:f:E:k", "sizes")
SHAPES = (moe_layer.PRESETS, "T:d:f:E:k", "shapes")
EP_SHAPE = ({}, "T:d:f:E:k", "shape")  # expert_parallel: no presets


@pytest.mark.parametrize(
  "spec, kind",
  [
    ("128:64:8", SIZES),
    ("128:x:8:2", SIZES),
    ("128:64:0:2", SIZES),
    ("", SIZES),
    ("64:32:32:4", SHAPES),
    ("64:32:32:4:2:1", SHAPES),
    ("big", SHAPES),
    ("lm", EP_SHAPE),
    ("64:-1:32:4:2", EP_SHAPE),
  ],
)
def test_a_bad_size_or_shape_is_refused_naming_the_flag(spec, kind):
  presets, fields, flag = kind
  with pytest.raises(ConfigError) as refused:
    cli.preset_or_ints(spec, presets, fields, flag)
  message = str(refused.value)
  assert message.endswith(f"{fields} of positive ints (--{flag}={spec})")
  assert message.startswith(f"a preset {sorted(presets)} or ") == bool(presets)
  assert "\n" not in message


def test_presets_and_explicit_dims_parse():
  assert cli.preset_or_ints("large", *SIZES) == ("large", (512, 1024, 8, 2))
  assert cli.preset_or_ints("8:16:4:2", *SIZES) == ("8:16:4:2", (8, 16, 4, 2))
  assert cli.preset_or_ints("64:32:32:4:2", *SHAPES) == ("64:32:32:4:2", (64, 32, 32, 4, 2))
