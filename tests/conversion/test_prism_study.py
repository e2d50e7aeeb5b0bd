"""The Prism-MoE study (configs/studies/prism_moe.py, moejax/studies/scorers/prism_moe.py)
and the fine-tuning it runs (moejax/conversion/finetune.py), on the tiny dense LM."""

import numpy as np
import pytest

from moejax.configs.studies import prism_moe as prism_study
from moejax.conversion import convert, finetune
from moejax.data.pipeline import train_token_stream
from moejax.errors import ConfigError
from moejax.posttrain.source import load_training
from moejax.studies import runner

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def test_the_config_loads_over_three_dense_seeds():
  config = prism_study.get_config("seeds=3")
  assert [m["workdir"] for m in config.models] == [
    "runs/zoo/s_dense",
    "runs/zoo/s_dense_seed1",
    "runs/zoo/s_dense_seed2",
  ]
  assert len(config.arms) == 8 and {a["partition"] for a in config.arms} == set(
    prism_study.PARTITIONS
  )
  assert config.settings.top_k == 3 and config.settings.experts == 8
  small = prism_study.get_config("seeds=2,model=xs_dense")
  assert [m["workdir"] for m in small.models] == ["runs/zoo/xs_dense", "runs/zoo/xs_dense_seed1"]
  assert "zoo xs_dense" in small.description
  with pytest.raises(ConfigError, match="config arg model"):
    prism_study.get_config("model=xs")


def tiny_study(workdir, arms, **settings):
  c = prism_study.get_config()
  c.settings.update(
    {
      **dict(
        workdir=workdir,
        num_windows=2,
        bytes_per_domain=256,
        trajectories=4,
        length=15,
        held_out=4,
        budget=1.0,
      ),
      **settings,
    }
  )
  c.arms = [a for a in c.arms if a["name"] in arms]
  c.reference = arms[0]
  c.claims = [x for x in c.claims if x["arm"] in arms and x["reference"] in arms]
  return c


@pytest.mark.integration
def test_a_tiny_study_converts_once_per_partition_and_fine_tunes_each_arm(dense, tmp_path):
  workdir = dense[0]
  config = tiny_study(workdir, ["trajectory", "trajectory_supervised"])
  spec, scorer = runner.prepare(config)
  results = runner.run(spec, scorer, str(tmp_path / "out"), plot=False, log=lambda _: None)
  runs = {r["arm"]: r["metrics"] for r in results["runs"]}
  assert runs["trajectory"]["kl0"] == runs["trajectory_supervised"]["kl0"] > 0
  assert runs["trajectory"]["bpb"] != runs["trajectory_supervised"]["bpb"]
  assert all(np.isfinite(v) for r in runs.values() for v in r.values() if isinstance(v, float))


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(top_k=9), r"top_k=9 must be in \[1, experts=8\]"),
    (dict(experts=5), r"5 experts must divide the dense FFN width d_ff=64"),
    (dict(budget=0.0), r"study.settings.budget=0.0 must be in \(0, 1\]"),
  ],
)
def test_bad_settings_are_refused_before_any_run(dense, tmp_path, change, message):
  config = tiny_study(dense[0], ["random"], **change)
  with pytest.raises(ConfigError, match=message):
    runner.prepare(config)


@pytest.mark.integration
def test_supervision_reaches_the_routers_not_the_experts_and_descends(dense):
  """Weight 0: the term is not computed. Its gradient is 0 on the last block's expert
  weights (the target is held constant; earlier experts move later blocks' inputs),
  not on the routers, and a step along it on the routers lowers it."""
  import jax

  workdir, m, params, rest = dense
  src = load_training(workdir)
  moe_m, moe_params, _ = convert.convert(m, params, rest, "random", 8, 3, trajectories=4, length=15)
  config = convert.training_config(src.config, moe_m, 1.0)
  batches = finetune.windows(train_token_stream(src.config.data), 2, 4, 16, seed=0)
  _, log0 = finetune.finetune(config, m, params, rest, moe_params, rest, batches, 0.0)
  assert [s for _, s in log0] == [0.0, 0.0]
  loss = finetune.make_loss(m, moe_m, 1.0)
  sup = jax.jit(lambda p: loss(p, rest, params, rest, batches[0])[1][1])  # one program, not
  g = jax.jit(jax.grad(sup))(moe_params)  # one per operation
  last = g["blocks"][max(g["blocks"])]["ffn"]["experts"]
  assert all(float(np.abs(w).max()) == 0 for w in last.values())
  for block in g["blocks"].values():
    assert float(np.abs(block["ffn"]["router_kernel"]).max()) > 0
  stepped = jax.tree.map(lambda x: x, moe_params)
  for i, block in stepped["blocks"].items():
    r = g["blocks"][i]["ffn"]["router_kernel"]
    block["ffn"]["router_kernel"] = block["ffn"]["router_kernel"] - 1e-3 * r / np.abs(r).max()
  assert float(sup(stepped)) < float(sup(moe_params)) > 0
