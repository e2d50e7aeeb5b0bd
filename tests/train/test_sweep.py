"""Training runs for studies (moejax/train/sweep.py): overrides, run configs, summaries,
re-use of finished runs, seeds."""

import json
import os
import types

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.train import sweep as sweep_lib

MOE = "configs/lm_shakespeare_moe.py"


def test_overrides_are_typed_and_unknown_keys_named():
  c = sweep_lib.load_config_file(MOE + ":size=tiny")
  sweep_lib.apply_overrides(
    c,
    (
      "model.moe.top_k=1",
      "model.moe.capacity.factor=2",
      "model.moe.router=probmoe",
      "train.progress_bar=false",
      "model.moe.loss_weights.dpsl=1e-2",
      "train.steps=1e3",
    ),
  )
  assert c.model.moe.top_k == 1 and isinstance(c.model.moe.top_k, int)
  assert c.model.moe.capacity.factor == 2.0 and isinstance(c.model.moe.capacity.factor, float)
  assert c.model.moe.router == "probmoe" and c.train.progress_bar is False
  assert c.model.moe.loss_weights.dpsl == 0.01 and c.train.steps == 1000
  for bad, named in [
    ("model.moe.topk=1", "model.moe.topk"),
    ("model.moe.nope.x=1", "model.moe.nope.x"),
    ("model.moe.top_k=two", "model.moe.top_k"),
    ("train.steps", "train.steps"),
    ("train.steps=2.5", "train.steps"),
    ("model.l3.layers=1", "model.l3.layers"),
    ("model.moe.dropless_tile=64", "flat key of older configs; use model.moe.dropless.tile"),
  ]:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
      sweep_lib.apply_overrides(c, (bad,))


def test_run_config_sets_seed_and_budget_after_the_overrides_and_validates():
  c = sweep_lib.run_config(
    MOE + ":size=tiny", ["model.moe.top_k=1", "train.steps=9"], seed=7, steps=3
  )
  assert (c.seed, c.train.steps, c.model.moe.top_k, c.train.progress_bar) == (7, 3, 1, False)
  with pytest.raises(ConfigError, match="top_k"):
    sweep_lib.run_config(MOE + ":size=tiny", ["model.moe.top_k=9"], seed=0, steps=3)
  with pytest.raises(ConfigError, match="nope.py"):
    sweep_lib.run_config("configs/nope.py", [], seed=0, steps=3)


def test_summary_is_median_speed_and_late_layer_mean():
  records = []
  for step in range(1, 9):
    records.append(
      {
        "step": step,
        "tokens_per_second": float(step * 100),
        "moe/layer0/max_over_mean_load": float(step),
        "moe/layer1/max_over_mean_load": float(step + 2),
        "moe/layer0/load_fraction/e0": 9.0,
      }
    )
  records.append({**records[-1], "tokens_per_second": 800.0})  # step 8 re-logged on resume
  out = sweep_lib.summarize(records, {"val_bpb": 2.5}, 10)
  # 8 distinct steps: median of 100..800 = 450; last quarter = steps 7, 8 over both
  # layers: mean(7, 8, 9, 10) = 8.5; the other columns have no values.
  assert out["tokens_per_second"] == 450.0 and out["max_over_mean_load"] == 8.5
  assert out["val_bpb"] == 2.5 and out["steps"] == 8 and out["params"] == 10
  assert np.isnan(out["padding_waste"])


class FakeTrain:
  """Stands in for train_and_evaluate: writes a metrics log, counts calls."""

  def __init__(self):
    self.calls = 0

  def __call__(self, config, run_dir):
    self.calls += 1
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      for step in range(1, config.train.steps + 1):
        f.write(json.dumps({"step": step, "tokens_per_second": 1000.0}) + "\n")
    return types.SimpleNamespace(
      state=types.SimpleNamespace(params={"w": np.zeros((3, 4))}),
      eval={"val_bpb": 2.0 + config.model.moe.top_k / 10},
    )


def test_a_finished_run_is_read_back_and_a_changed_one_refused(tmp_path):
  config = sweep_lib.run_config(MOE + ":size=tiny", [], seed=3, steps=4)
  fake, run_dir = FakeTrain(), str(tmp_path / "a")
  first = sweep_lib.train_run(config, run_dir, train_fn=fake, log=id)
  assert fake.calls == 1 and first["val_bpb"] == pytest.approx(2.2)
  assert first["params"] == 12 and first["seed"] == 3 and first["steps"] == 4
  log = []
  again = sweep_lib.train_run(config, run_dir, train_fn=fake, log=log.append)
  assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True)  # NaN too
  assert fake.calls == 1 and log == [f"{run_dir}: finished earlier, not re-run"]
  os.remove(os.path.join(run_dir, "result.json"))  # interrupted before it finished
  sweep_lib.train_run(config, run_dir, train_fn=fake, log=id)
  assert fake.calls == 2
  changed = sweep_lib.run_config(MOE + ":size=tiny", ["model.moe.top_k=1"], seed=3, steps=4)
  with pytest.raises(ConfigError, match="another config"):
    sweep_lib.train_run(changed, run_dir, train_fn=fake, log=id)


def test_a_result_from_an_older_schema_still_counts_as_finished():
  config = sweep_lib.load_config_file(MOE + ":size=tiny")
  saved = {
    k: v
    for k, v in sweep_lib.fingerprint(config.to_dict()).items()
    if not k.startswith("model.l3.")
  }  # written before model.l3 existed
  assert sweep_lib.same_config(saved, config)
  saved["model.moe.top_k"] = 1
  assert not sweep_lib.same_config(saved, config)


def test_an_empty_dict_that_replaces_a_default_reads_back_as_empty():
  """model.moe.loss_weights={} (no router loss; a fine-tuning config's choice) against
  its default {load_balance, z_loss}: the finished run counts as the same config, and
  one with the default weights does not."""
  config = sweep_lib.load_config_file(MOE + ":size=tiny")
  config.model.moe.loss_weights = {}
  saved = json.loads(json.dumps(sweep_lib.fingerprint(config.to_dict())))  # result.json
  assert saved["model.moe.loss_weights"] == {}
  assert sweep_lib.same_config(saved, config)
  default = sweep_lib.load_config_file(MOE + ":size=tiny")
  assert default.model.moe.loss_weights  # non-empty by default
  assert not sweep_lib.same_config(saved, default)


@pytest.mark.parametrize(
  "seeds,message",
  [
    ((), r"seeds=\(\) is empty"),
    ((0, 1, 0), r"gives seed 0 twice"),
    ((0, -1), r"must be ints in \[0, 2\*\*32\)"),
    ((True,), r"must be ints"),
    ("01", r"must be a list of ints"),
  ],
)
def test_bad_seeds_are_refused(seeds, message):
  with pytest.raises(ConfigError, match=message):
    sweep_lib.check_seeds(seeds)
  assert sweep_lib.check_seeds([3, 1]) == (3, 1)
