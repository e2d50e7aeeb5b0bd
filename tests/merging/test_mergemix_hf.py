"""MergeMix on imported HF checkpoints (a tiny Mixtral family exported from tiny
workdirs, read back through the importer): the mixture is base + sum alpha_k
tau_k leaf by leaf, the proxy at a vertex scores exactly as the imported expert,
and experiments.merge --method=mergemix writes the merge or refuses weights off the
simplex in one line."""

import os

import jax
import numpy as np
import pytest

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.interop.convert import export_hf
from moejax.merging import mergemix
from moejax.merging.base import leaves
from moejax.models.decoder import abstract_model
from moejax.posttrain import source
from moejax.posttrain.domain_finetune import window_nats
from tests.helpers import training_workdir
from tests.cli.harness import assert_refused, run_entry


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
  """{name: HF directory} of a base and two experts (tiny MoE, seeds 0, 1, 2)."""
  root = tmp_path_factory.mktemp("mergemix_hf")
  out = {}
  for seed, name in enumerate(("base", "a", "b")):
    config = get_config("size=tiny")
    config.seed = seed
    workdir = str(root / f"{name}_workdir")
    training_workdir(workdir, config)
    loaded = source.load(workdir=workdir)
    out[name] = str(root / name)
    export_hf(loaded.model, loaded.params, loaded.rest, out[name], family="mixtral")
  return out


def imported(path):
  loaded = source.load(hf_dir=path)
  loaded.params = jax.tree.map(np.asarray, loaded.params)
  return loaded


def test_a_mixture_of_imported_experts_and_its_proxy_at_a_vertex(hf_models):
  base, a, b = (imported(hf_models[n]) for n in ("base", "a", "b"))
  assert base.kind == "hf"
  alpha = np.array([0.3, 0.7])
  merged = mergemix.mixture_params(base.params, [a.params, b.params], alpha)
  for (path, got), (_, t0), (_, t1), (_, t2) in zip(
    *(leaves(t) for t in (merged, base.params, a.params, b.params))
  ):
    t0, t1, t2 = (np.asarray(x, np.float64) for x in (t0, t1, t2))
    np.testing.assert_allclose(got, t0 + 0.3 * (t1 - t0) + 0.7 * (t2 - t0), rtol=1e-5, atol=1e-7)

  graphdef = abstract_model(base.model)[0]
  windows = np.random.default_rng(0).integers(0, 256, size=(3, 33)).astype(np.int32)

  def score(params):
    return float(np.mean(window_nats(graphdef, params, base.rest, windows)))

  scores = mergemix.proxy_scores(base.params, [a.params, b.params], np.eye(2), score)
  assert scores.tolist() == [score(a.params), score(b.params)]


def test_experiments_merge_with_mergemix_on_hf_checkpoints(hf_models, tmp_path):
  out = str(tmp_path / "merged")
  result = run_entry(
    "experiments.merge",
    f"--base={hf_models['base']}",
    f"--experts={hf_models['a']},{hf_models['b']}",
    "--method=mergemix",
    "--weights=0,1",
    f"--out={out}",
  )
  assert result.code == 0, result.stderr
  got = source.load(workdir=out).params
  want = imported(hf_models["b"]).params
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got), want)
  refused = run_entry(
    "experiments.merge",
    f"--base={hf_models['base']}",
    f"--experts={hf_models['a']},{hf_models['b']}",
    "--method=mergemix",
    "--weights=0.7,0.7",
    f"--out={tmp_path / 'never'}",
  )
  assert_refused(refused, "--weights=0.7,0.7", "sum to 1.4")
  assert not os.path.exists(tmp_path / "never")
