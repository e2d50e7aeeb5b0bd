"""The `training` scorer: one run per (arm, seed), re-used when finished, refused when
changed; every bad input a ConfigError before any run; its paired statistics equal the
committed sweep tables on the same per-run results; a tiny study end to end."""

import json
import os
import re

import ml_collections
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.studies import report, runner
from moejax.train.sweep import load_config_file

from tests.studies.fake_training import FakeTrain, run

MOE = "configs/lm_shakespeare_moe.py:size=tiny"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def study(workdir, draws=2, **changes):
  c = ml_collections.ConfigDict()
  c.name, c.scorer, c.draws, c.reference = "tiny_training", "training", draws, "top2"
  c.settings = {"workdir": str(workdir), "steps": 3, "common": ["train.eval_every=2"]}
  c.arms = [
    {"name": "top2", "config": MOE},
    {"name": "top1", "config": MOE, "overrides": ["model.moe.top_k=1"]},
  ]
  c.claims = [
    {
      "arm": "top1",
      "reference": "top2",
      "metric": "val_bpb",
      "expect": "lower",
      "text": "top-1 lower",
    }
  ]
  for key, value in changes.items():
    c[key] = value
  return c


def test_each_arm_trains_once_per_seed_and_pairs_by_seed(tmp_path):
  fake = FakeTrain(tmp_path / "runs")
  results = run(study(tmp_path / "runs"), tmp_path / "out", fake)
  assert fake.calls == ["top2/seed_0", "top1/seed_0", "top2/seed_1", "top1/seed_1"]
  bpb = {(r["arm"], r["draw"]): r["metrics"]["val_bpb"] for r in results["runs"]}
  assert bpb == pytest.approx(
    {("top2", 0): 10.2, ("top1", 0): 10.1, ("top2", 1): 10.21, ("top1", 1): 10.11}
  )
  (claim,) = results["claims"]
  assert claim["interval"]["mean"] == pytest.approx(-0.1) and claim["interval"]["n"] == 2
  run_ = results["runs"][2]["metrics"]  # summarize: median speed, params, steps
  assert run_["tokens_per_second"] == 1002.0 and run_["params"] == 12 and run_["steps"] == 3
  assert "max_over_mean_load" not in run_  # NaN figures are left out
  # the scorer re-uses a finished run (another output directory, same workdir) ...
  again = FakeTrain(tmp_path / "runs")
  assert run(study(tmp_path / "runs"), tmp_path / "out2", again)["runs"] == results["runs"]
  assert again.calls == []
  # ... trains only what is missing, with the seeds given
  os.remove(tmp_path / "runs" / "top1" / "seed_1" / "result.json")
  seeded = study(tmp_path / "runs", draws=1)
  seeded.settings.seeds = [1]
  run(seeded, tmp_path / "out3", again)
  assert again.calls == ["top1/seed_1"]
  # ... and refuses a run directory that holds another config
  changed = study(tmp_path / "runs")
  changed.settings.common = ["train.eval_every=3"]
  with pytest.raises(ConfigError, match="another config"):
    run(changed, tmp_path / "out4", again)


def test_levels_are_overrides_with_their_own_run_directories(tmp_path):
  fake = FakeTrain(tmp_path / "runs")
  config = study(
    tmp_path / "runs", draws=1, levels=[{"model.moe.num_experts": 4}, {"model.moe.num_experts": 8}]
  )
  results = run(config, tmp_path / "out", fake)
  assert fake.calls[:2] == [
    "top2/model.moe.num_experts=4/seed_0",
    "top1/model.moe.num_experts=4/seed_0",
  ]
  bpb = {
    (r["arm"], r["level"]["model.moe.num_experts"]): r["metrics"]["val_bpb"]
    for r in results["runs"]
  }
  assert bpb == pytest.approx(
    {("top2", 4): 6.2, ("top1", 4): 6.1, ("top2", 8): 10.2, ("top1", 8): 10.1}
  )


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(settings={"workdir": ""}), r"study\.settings\.workdir=''"),
    (dict(settings={"steps": 0}), r"study\.settings\.steps=0 must be an integer >= 1"),
    (dict(settings={"seeds": [0, 1, 0]}), r"study\.settings\.seeds=\[0, 1, 0\] gives seed 0 twice"),
    (dict(settings={"seeds": [4]}), r"study\.settings\.seeds=\[4\] has 1 seeds for study\.draws=2"),
    (dict(settings={"common": ["seed=3"]}), r"study\.settings\.common sets 'seed'"),
    (dict(settings={"domains": ["drama"]}), r"study\.settings\.domains needs"),
    (
      dict(arms=[{"name": "top2", "config": MOE, "overrides": ["model.moe.topk=1"]}]),
      r"study\.arms\[0\] \(arm 'top2'\): override model\.moe\.topk=.*no config key",
    ),
    (
      dict(arms=[{"name": "top2", "config": MOE, "overrides": ["model.moe.top_k=9"]}]),
      r"study\.arms\[0\] \(arm 'top2'\).*top_k",
    ),
    (dict(arms=[{"name": "top2", "config": "configs/nope.py"}]), r"study\.arms\[0\].*nope\.py"),
    (
      dict(arms=[{"name": "top2", "config": MOE, "overrides": ["train.steps=9"]}]),
      r"study\.arms\[0\]\.overrides \(arm 'top2'\) sets 'train\.steps'",
    ),
    (dict(arms=[{"name": "a/b", "config": MOE}]), r"study\.arms\[0\]\.name='a/b'"),
    (dict(levels=[{"model.moe.nope": 1}]), r"study\.arms\[0\] \(arm 'top2'\) at level"),
  ],
)
def test_bad_input_is_one_config_error_before_any_run(tmp_path, change, message):
  config = study(tmp_path / "runs")
  for key, value in change.items():
    if key == "settings":
      config.settings.update(value)
    else:
      config[key] = value
      if key == "arms":
        config.claims, config.reference = [], value[0]["name"]
  fake = FakeTrain()
  with pytest.raises(ConfigError, match=message):
    run(config, tmp_path / "out", fake)
  assert fake.calls == [] and not os.path.exists(tmp_path / "out")


def test_a_workdir_that_is_a_training_run_is_refused(tmp_path):
  (tmp_path / "runs" / "checkpoints").mkdir(parents=True)
  with pytest.raises(ConfigError, match=r"study\.settings\.workdir=.*not a training path"):
    run(study(tmp_path / "runs"), tmp_path / "out", FakeTrain())


def committed_rows(path: str) -> dict:
  """{table title: {arm: (mean, std, delta, delta std, lo, hi)}} of a committed seed table."""
  tables, title = {}, None
  number = r"([+-]?\d+\.\d+)"
  for line in open(os.path.join(ROOT, path)):
    if line.startswith("#"):
      title = line.strip("# \n")
    match = re.match(
      rf"\| (\w+) \| [\d,]+ \| {number} ± {number} \| {number} ± {number} \| "
      rf"\[{number}, {number}\]",
      line,
    )
    if match:
      tables.setdefault(title, {})[match[1]] = tuple(map(float, match.groups()[1:]))
  return tables


def test_paired_statistics_equal_the_committed_sweep_tables():
  """The per-run results of the committed 3-seed zoo-xs router sweep, fed to the study
  report: every mean, std, paired difference and 95% interval equals the old runner's
  tables (docs/results/ablations/routers_zoo_xs.md and _routing.md) to their 4 decimals."""
  spec, _ = runner.prepare(load_config_file("configs/studies/routers_seeds.py:base=zoo_xs"))
  old = json.load(open(os.path.join(ROOT, "docs/results/ablations/routers_zoo_xs.json")))
  runs = [
    {
      "arm": r["name"],
      "level": {},
      "draw": r["seed"],
      "metrics": {k: v for k, v in r.items() if isinstance(v, float)},
    }
    for r in old
  ]
  by_key = report.index_runs(runs)
  tables = committed_rows("docs/results/ablations/routers_zoo_xs.md")
  tables.update(committed_rows("docs/results/ablations/routers_zoo_xs_routing.md"))
  tables["heldout_bpb"] = tables.pop("Router ablation on zoo-xs on mix, 3 seeds")
  assert len(tables) == 9 and all(len(rows) == 6 for rows in tables.values())
  for metric, rows in tables.items():
    for arm, figures in rows.items():
      _, a, r = report.paired(spec, by_key, arm, "topk", {}, metric)
      diff = report.stats.paired_difference(a, r)
      new = (np.mean(a), np.std(a, ddof=1), diff.mean, diff.std, diff.lo, diff.hi)
      assert [f"{x:.4f}" for x in new] == [f"{x:.4f}" for x in figures], (metric, arm)
  claims = {(row["arm"], row["metric"]): row["verdict"] for row in report.claim_rows(spec, runs)}
  assert claims[("probmoe_exact", "heldout_bpb")] == "opposite direction"
  assert claims[("dpsl", "routing_entropy")] == "reproduces"
  assert claims[("expert_choice", "max_over_mean_load")] == "reproduces"
  assert claims[("smooth_topk", "heldout_bpb")].startswith(
    "no detectable difference (|delta| < 0.0126"
  )


@pytest.mark.integration
def test_a_tiny_study_end_to_end(tmp_path):
  """2 arms x 2 seeds of the tiny MoE, 4 steps, scored by the harness on the first
  4096 held-out bytes: real training, the results, the table and the curves."""
  from tests.cli.harness import run_entry

  config = tmp_path / "tiny.py"
  config.write_text(
    "import ml_collections\n"
    "def get_config():\n"
    "  c = ml_collections.ConfigDict()\n"
    "  c.name, c.scorer, c.draws, c.reference = 'tiny', 'training', 2, 'top2'\n"
    f"  c.settings = {{'workdir': {str(tmp_path / 'runs')!r}, 'steps': 4,\n"
    "                'common': ['train.eval_every=2', 'train.log_every=2',\n"
    "                           'train.eval_batches=1'],\n"
    "                'heldout_bytes_per_domain': 4096, 'domains': ['shakespeare']}\n"
    f"  c.arms = [{{'name': 'top2', 'config': {MOE!r}}},\n"
    f"            {{'name': 'top1', 'config': {MOE!r}, 'overrides': ['model.moe.top_k=1']}}]\n"
    "  c.claims = [{'arm': 'top1', 'reference': 'top2', 'metric': 'heldout_bpb',\n"
    "               'expect': None, 'text': 'top-1 against top-2'}]\n"
    "  return c\n"
  )
  out = tmp_path / "out"
  result = run_entry("experiments.study", f"--config={config}", f"--out={out}")
  assert result.code == 0, result.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert [(r["arm"], r["draw"]) for r in results["runs"]] == [
    ("top2", 0),
    ("top1", 0),
    ("top2", 1),
    ("top1", 1),
  ]
  for r in results["runs"]:
    m = r["metrics"]
    assert m["steps"] == 4 and m["heldout_bytes"] == 4096
    assert m["heldout_bpb/shakespeare"] == m["heldout_bpb"] != m["val_bpb"]
    saved = json.load(open(tmp_path / "runs" / r["arm"] / f"seed_{r['draw']}" / "result.json"))
    assert saved["seed"] == r["draw"] and saved["heldout_bpb"] == m["heldout_bpb"]
  bpb = {(r["arm"], r["draw"]): r["metrics"]["heldout_bpb"] for r in results["runs"]}
  assert bpb[("top2", 0)] != bpb[("top2", 1)]  # the seed changes the run
  (claim,) = results["claims"]
  assert claim["interval"]["mean"] == pytest.approx(
    np.mean([bpb[("top1", d)] - bpb[("top2", d)] for d in (0, 1)])
  )
  assert "| top1 |" in (out / "results.md").read_text()
  assert (out / "results.png").stat().st_size > 10_000  # the training curves
