"""experiments.merge end to end on tiny workdirs (initialised, not trained): the
written workdir loads like any other and holds the merge; an imported HF
checkpoint merges too; refusals are one line and write nothing."""

import json
import os

import jax
import numpy as np
import pytest

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.interop.convert import export_hf
from moejax.merging import base as merging_base
from moejax.merging.nash import nash_weights
from moejax.posttrain import source
from tests.helpers import training_workdir
from tests.cli.harness import assert_refused, run_entry, tree_hash


def workdir(path, seed=0, **overrides):
  config = get_config("size=tiny")
  config.seed = seed
  for key, value in overrides.items():
    setattr(config.model.moe, key, value)
  training_workdir(str(path), config)
  return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  root = tmp_path_factory.mktemp("merge")
  return {
    "root": root,
    "base": workdir(root / "base", 0),
    "a": workdir(root / "a", 1),
    "b": workdir(root / "b", 2),
    "wide": workdir(root / "wide", 3, num_experts=4),
  }


def params(path):
  return jax.tree.map(np.asarray, source.load(workdir=path).params)


def exported(path, out):
  """The training workdir `path` exported as a Mixtral HF directory at `out`."""
  loaded = source.load(workdir=path)
  export_hf(loaded.model, loaded.params, loaded.rest, str(out), family="mixtral")
  return str(out)


def test_one_hot_task_arithmetic_writes_a_training_workdir_holding_that_expert(models, tmp_path):
  out = str(tmp_path / "merged")
  result = run_entry(
    "experiments.merge",
    f"--base={models['base']}",
    f"--experts={models['a']},{models['b']}",
    "--method=task_arithmetic",
    "--weights=0,1",
    f"--out={out}",
  )
  assert result.code == 0, result.stderr
  merged, want = params(out), params(models["b"])
  jax.tree.map(np.testing.assert_array_equal, merged, want)
  loaded = source.load(workdir=out)
  assert loaded.kind == "training" and loaded.step == 0
  report = json.load(open(os.path.join(out, "merge.json")))
  assert report["weights"] == [0.0, 1.0] and report["settings"] == {"scale": 1.0}


def test_average_of_an_hf_checkpoint_and_a_workdir_is_a_converted_workdir(models, tmp_path):
  hf = exported(models["a"], tmp_path / "hf")
  out = str(tmp_path / "merged")
  result = run_entry(
    "experiments.merge",
    f"--base={hf}",
    f"--experts={hf},{models['b']}",
    "--method=average",
    f"--out={out}",
  )
  assert result.code == 0, result.stderr
  merged = source.load(workdir=out)
  assert merged.kind == "converted"
  got = merged.params["blocks"][0]["ffn"]["experts"]["w_up"]
  halves = [params(p)["blocks"][0]["ffn"]["experts"]["w_up"] for p in (models["a"], models["b"])]
  np.testing.assert_allclose(got, (halves[0].astype(np.float64) + halves[1]) / 2, rtol=1e-6)


@pytest.mark.parametrize(
  "args, names",
  [
    (
      ["--experts={a},{wide}"],
      [
        "models differ in shape at parameter blocks/0/ffn/experts/",
        "(8, ",
        "(4, ",
        "--experts[1]=",
      ],
    ),
    (
      ["--experts={a},{b}", "--method=average", "--weights=0.6,0.6"],
      ["--weights=0.6,0.6", "sum to 1.2"],
    ),
    (["--experts={a},{b}", "--method=ties", "--weights=1.2,-0.2"], ["weight -0.2 is negative"]),
    (["--experts={a},{b}", "--weights=1,2,3"], ["--weights=1,2,3", "3 weights for 2 models"]),
    (["--experts={a},{b}", "--out={base}/inside"], ["--out=", "inside the input --base"]),
    (["--experts={a},{b}", "--method=average", "--scale=2"], ["--scale", "no setting"]),
  ],
)
def test_refusals_are_one_line_and_write_nothing(models, tmp_path, args, names):
  def fill(a):
    return a.format(**{k: v for k, v in models.items() if k != "root"})

  out = [f"--out={tmp_path / 'out'}"] if not any("--out" in a for a in args) else []
  before = tree_hash(str(models["root"]))
  result = run_entry("experiments.merge", f"--base={models['base']}", *map(fill, args), *out)
  assert_refused(result, *names)
  assert tree_hash(str(models["root"])) == before and not os.path.exists(tmp_path / "out")


def test_a_method_that_reads_a_base_refuses_to_run_without_one(models, tmp_path):
  result = run_entry(
    "experiments.merge",
    f"--experts={models['a']},{models['b']}",
    "--method=ties",
    f"--out={tmp_path / 'out'}",
  )
  assert_refused(result, "--method=ties", "--base")
  result = run_entry(
    "experiments.merge",
    f"--experts={models['a']},{models['b']}",
    "--method=average",
    f"--out={tmp_path / 'out'}",
  )
  assert result.code == 0, result.stderr


def test_nash_merge_of_workdirs_onto_an_hf_base_adds_the_bargained_direction(models, tmp_path):
  hf = exported(models["base"], tmp_path / "hf")
  out = str(tmp_path / "merged")
  result = run_entry(
    "experiments.merge",
    f"--base={hf}",
    f"--experts={models['a']},{models['b']}",
    "--method=nash",
    "--scale=0.5",
    f"--out={out}",
  )
  assert result.code == 0, result.stderr
  base = jax.tree.map(np.asarray, source.load(hf_dir=hf).params)
  experts = [params(models[name]) for name in ("a", "b")]
  flat = [
    np.concatenate(
      [np.asarray(leaf, np.float64).reshape(-1) for _, leaf in merging_base.leaves(tree)]
    )
    for tree in [base] + experts
  ]
  g = np.stack([flat[1] - flat[0], flat[2] - flat[0]], axis=1)
  alpha = nash_weights(g.T @ g)
  merged = source.load(workdir=out).params["blocks"][0]["ffn"]["experts"]["w_up"]
  pick = [t["blocks"][0]["ffn"]["experts"]["w_up"].astype(np.float64) for t in [base] + experts]
  want = pick[0] + 0.5 * (alpha[0] * (pick[1] - pick[0]) + alpha[1] * (pick[2] - pick[0]))
  np.testing.assert_allclose(merged, want, rtol=1e-5, atol=1e-7)
