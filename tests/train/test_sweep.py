"""The ablation runner: overrides, summaries, resumability, early errors, report."""
import json
import os
import subprocess
import sys
import types

import ml_collections
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.train import sweep as sweep_lib
from moejax.train.sweep_report import markdown_table

MOE = "configs/lm_shakespeare_moe.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_sweep(variants, steps=5):
  c = ml_collections.ConfigDict()
  c.title, c.steps, c.seed = "test", steps, 3
  c.common = ("train.eval_every=2",)
  c.variants = variants
  return c


def test_overrides_are_typed_and_unknown_keys_named():
  c = sweep_lib.load_config_file(MOE + ":size=tiny")
  sweep_lib.apply_overrides(c, ("model.moe.top_k=1", "model.moe.capacity_factor=2",
                                "model.moe.router=probmoe", "train.progress_bar=false",
                                "model.moe.loss_weights.dpsl=1e-2", "train.steps=1e3"))
  assert c.model.moe.top_k == 1 and isinstance(c.model.moe.top_k, int)
  assert c.model.moe.capacity_factor == 2.0 and isinstance(c.model.moe.capacity_factor, float)
  assert c.model.moe.router == "probmoe" and c.train.progress_bar is False
  assert c.model.moe.loss_weights.dpsl == 0.01 and c.train.steps == 1000
  for bad, named in [("model.moe.topk=1", "model.moe.topk"),
                     ("model.moe.nope.x=1", "model.moe.nope.x"),
                     ("model.moe.top_k=two", "model.moe.top_k"),
                     ("train.steps", "train.steps"),
                     ("train.steps=2.5", "train.steps"),
                     ("model.l3.layers=1", "model.l3.layers")]:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
      sweep_lib.apply_overrides(c, (bad,))


def test_summary_is_median_speed_and_late_layer_mean():
  records = []
  for step in range(1, 9):
    records.append({"step": step, "tokens_per_second": float(step * 100),
                    "moe/layer0/max_over_mean_load": float(step),
                    "moe/layer1/max_over_mean_load": float(step + 2),
                    "moe/layer0/load_fraction/e0": 9.0})
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
    self.calls = []

  def __call__(self, config, run_dir):
    self.calls.append(os.path.basename(run_dir))
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
      for step in range(1, config.train.steps + 1):
        f.write(json.dumps({"step": step, "tokens_per_second": 1000.0,
                            "ce_loss": 5.0 / step}) + "\n")
    params = {"w": np.zeros((3, 4))}
    bpb = 2.0 + config.model.moe.top_k / 10
    return types.SimpleNamespace(state=types.SimpleNamespace(params=params),
                                 eval={"val_bpb": bpb, "val_loss": 1.0})


def test_finished_variants_are_not_rerun_and_changed_ones_are_refused(tmp_path):
  variants = (("a", MOE + ":size=tiny", ()), ("b", MOE + ":size=tiny", ("model.moe.top_k=1",)))
  seeded = sweep_lib.variant_config(make_sweep(()), sweep_lib.Variant("s", MOE, ("seed=7",)))
  assert seeded.seed == 7 and sweep_lib.variant_config(
      make_sweep(()), sweep_lib.Variant("s", MOE)).seed == 3  # the sweep's seed otherwise
  fake = FakeTrain()
  first = sweep_lib.run_sweep(make_sweep(variants), str(tmp_path), train_fn=fake, log=id)
  assert fake.calls == ["a", "b"] and [r["params"] for r in first] == [12, 12]
  os.remove(tmp_path / "b" / "result.json")  # b was interrupted before it finished
  again = sweep_lib.run_sweep(make_sweep(variants), str(tmp_path), train_fn=fake, log=id)
  assert fake.calls == ["a", "b", "b"]
  assert [r["val_bpb"] for r in again] == pytest.approx([2.2, 2.1])
  table = markdown_table(again)
  assert "| b | 2.100 | -4.5% | 1,000 | 12 |" in table
  with pytest.raises(ConfigError, match="another config"):
    sweep_lib.run_sweep(make_sweep(variants, steps=6), str(tmp_path), train_fn=fake, log=id)


def test_a_bad_variant_fails_before_any_training(tmp_path):
  fake = FakeTrain()
  variants = (("good", MOE + ":size=tiny", ()),
              ("bad", MOE + ":size=tiny", ("model.moe.top_k=9",)))
  with pytest.raises(ConfigError, match="top_k"):
    sweep_lib.run_sweep(make_sweep(variants), str(tmp_path), train_fn=fake, log=id)
  with pytest.raises(ConfigError, match="names unique"):
    sweep_lib.run_sweep(make_sweep((variants[0], variants[0])), str(tmp_path),
                        train_fn=fake, log=id)
  with pytest.raises(ConfigError, match="nope.py"):
    sweep_lib.run_sweep(make_sweep((("x", "configs/nope.py", ()),)), str(tmp_path),
                        train_fn=fake, log=id)
  negative = make_sweep(variants[:1])
  negative.heldout_bytes_per_domain = -1
  with pytest.raises(ConfigError, match=r"^heldout_bytes_per_domain=-1 must be >= 0"):
    sweep_lib.run_sweep(negative, str(tmp_path), train_fn=fake, log=id)
  assert fake.calls == [] and not os.listdir(tmp_path)


def test_cli_trains_each_variant_and_writes_table_and_plot(tmp_path):
  sweep_file = tmp_path / "sweep.py"
  sweep_file.write_text(
      "import ml_collections\n"
      "def get_config():\n"
      "  c = ml_collections.ConfigDict()\n"
      "  c.title, c.steps, c.seed = 'cli', 4, 0\n"
      "  c.common = ('train.eval_every=2', 'train.log_every=2', 'train.eval_batches=1')\n"
      "  c.heldout_bytes_per_domain = 4096\n"
      f"  c.variants = (('topk', '{MOE}:size=tiny', ()),\n"
      f"                ('top1', '{MOE}:size=tiny', ('model.moe.top_k=1',)))\n"
      "  return c\n")
  workdir = tmp_path / "out"
  cmd = [sys.executable, "-m", "experiments.ablate", f"--config={sweep_file}",
         f"--workdir={workdir}", f"--config.steps=4"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  results = json.loads((workdir / "sweep.json").read_text())
  assert [r["name"] for r in results] == ["topk", "top1"]
  assert all(r["steps"] == 4 and np.isfinite(r["val_bpb"]) for r in results)
  # scored by the harness on the first 4096 bytes of the held-out plays: the
  # loop's eval (one batch of other windows) is a different sample of the same text
  for r in results:
    assert r["heldout_bytes"] == 4096 and r["heldout_bpb/shakespeare"] == r["heldout_bpb"]
    assert r["heldout_bpb"] != r["val_bpb"] and abs(r["heldout_bpb"] / r["val_bpb"] - 1) < 0.1
  # top-1 routes half the assignments of top-2: its load figures differ.
  assert results[0]["max_over_mean_load"] != results[1]["max_over_mean_load"]
  assert (workdir / "sweep_curves.png").stat().st_size > 10_000
  assert "| topk |" in (workdir / "sweep.md").read_text()
  # Run again (in this process: a second child would only repeat the imports): the
  # results the CLI wrote count as finished, nothing trains.
  sweep = sweep_lib.load_config_file(str(sweep_file))
  sweep.steps = 4
  fake, log = FakeTrain(), []
  sweep_lib.run_sweep(sweep, str(workdir), train_fn=fake, log=log.append)
  assert fake.calls == [] and "topk: finished earlier, not re-run" in log


def test_a_result_from_an_older_schema_still_counts_as_finished():
  config = sweep_lib.load_config_file(MOE + ":size=tiny")
  saved = {k: v for k, v in sweep_lib.fingerprint(config.to_dict()).items()
           if not k.startswith("model.l3.")}  # written before model.l3 existed
  assert sweep_lib.same_config(saved, config)
  saved["model.moe.top_k"] = 1
  assert not sweep_lib.same_config(saved, config)
