"""Property-based: numeric and list flags of generate and train. Values that
must be refused are refused by the full contract (tests/cli/harness.py); valid
values pass flag validation (parse only: the job itself is not run)."""

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from moejax.errors import ConfigError
from tests.cli.harness import TRAIN_CONFIG
from tests.cli.harness import assert_refused, run_entry, tree_hash

FUZZ = settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
GEN, TRAIN = "experiments.generate", "experiments.train"
INT = st.integers(-(2**40), 2**40)
FLOAT = st.floats(-1e6, 1e6, allow_nan=False)

# flag -> (strategy of values, is the value acceptable?)
GENERATE_FLAGS = {
  "max_new_tokens": (INT, lambda v: v >= 1),
  "temperature": (FLOAT, lambda v: v >= 0),
  "top_k": (INT, lambda v: v >= 0),
  "top_p": (FLOAT | st.floats(-0.5, 1.5), lambda v: 0 < v <= 1),
  "seed": (INT, lambda v: 0 <= v < 2**32),
  "sere_rho": (FLOAT | st.floats(-0.5, 1.5), lambda v: 0 <= v <= 1),
}
TRAIN_FLAGS = {
  "stop_at_step": (INT, lambda v: v >= 1),
  "num_processes": (INT, lambda v: v >= 1),
  "process_id": (INT, lambda v: v >= 0),
}
# config keys that must be positive integers (refused by validate_config, before any writing)
TRAIN_KEYS = ("model.d_model", "model.num_layers", "data.batch_size", "data.seq_len", "train.steps")


def check(area, module, args, acceptable, name):
  if acceptable:
    assert run_entry(module, *args, parse_only=True).code == 0
    return
  before = tree_hash(area.root)
  assert_refused(run_entry(module, *args), name)
  assert tree_hash(area.root) == before


@pytest.mark.parametrize("flag", sorted(GENERATE_FLAGS))
def test_generate_numeric_flags(area, flag):
  values, ok = GENERATE_FLAGS[flag]

  @FUZZ
  @given(values)
  def prop(value):
    check(
      area, GEN, [f"--workdir={area.train}", f"--{flag}={value}"], ok(value), f"--{flag}={value}"
    )

  prop()


@FUZZ
@given(st.lists(st.integers(-3, 300), min_size=1, max_size=6))
def test_generate_prompt_ids(area, ids):
  """Ids outside [0, vocab) are refused naming the id; in-vocabulary lists parse."""
  from moejax.cli import token_ids

  text = ",".join(map(str, ids))
  bad = [i for i in ids if not 0 <= i < area.vocab_size]
  if not bad:
    assert token_ids(text, area.vocab_size, "prompt_ids") == ids
    return
  with pytest.raises(ConfigError, match=f"token id {bad[0]} is outside"):
    token_ids(text, area.vocab_size, "prompt_ids")


@settings(
  max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
  st.lists(st.integers(-3, 300), min_size=1, max_size=4).filter(
    lambda ids: any(not 0 <= i < 256 for i in ids)
  )
)
def test_generate_out_of_vocabulary_ids_end_to_end(area, ids):
  text = ",".join(map(str, ids))
  check(
    area, GEN, [f"--workdir={area.train}", f"--prompt_ids={text}"], False, f"--prompt_ids={text}"
  )


@pytest.mark.parametrize("flag", sorted(TRAIN_FLAGS))
def test_train_numeric_flags(area, flag):
  values, ok = TRAIN_FLAGS[flag]

  @FUZZ
  @given(values)
  def prop(value):
    check(
      area,
      TRAIN,
      [f"--config={TRAIN_CONFIG}", f"--workdir={area.missing}", f"--{flag}={value}"],
      ok(value),
      f"--{flag}={value}",
    )

  prop()


@FUZZ
@given(st.sampled_from(TRAIN_KEYS), st.integers(-(2**31), 0))
def test_train_non_positive_config_sizes(area, key, value):
  check(
    area,
    TRAIN,
    [f"--config={TRAIN_CONFIG}", f"--workdir={area.missing}", f"--config.{key}={value}"],
    False,
    f"{key}={value}",
  )
