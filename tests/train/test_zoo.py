"""The checkpoint zoo's machinery (moejax/train/zoo.py) on a tiny stand-in model:
cached builds, snapshot digests, bit-exact regeneration and its failure."""

import json
import os

import numpy as np
import pytest

from moejax.configs import zoo as zoo_configs
from moejax.errors import ConfigError
from moejax.train import zoo


@pytest.fixture(scope="module")
def config_of(tiny_config):
  """zoo.build's config_of(name, zoo_dir, seed): the tiny MoE LM, 6 steps, 2 snapshots."""

  def make(name, zoo_dir, seed=0):
    del name, zoo_dir
    c = tiny_config(steps=6, checkpoint_every=3, max_to_keep=10, eval_every=6)
    c.seed = seed
    return c

  return make


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory, config_of):
  zoo_dir = str(tmp_path_factory.mktemp("zoo"))
  entry = zoo.build(config_of, "xs", zoo_dir, bytes_per_domain=2048, probe_count=4, log=id)
  return zoo_dir, entry


@pytest.mark.integration
def test_build_caches_digests_and_evaluates(tiny_zoo, config_of, monkeypatch):
  zoo_dir, entry = tiny_zoo
  assert sorted(entry["snapshots"], key=int) == ["3", "6"]
  assert len(set(entry["snapshots"].values())) == 2  # the parameters moved
  assert entry["eval"]["bytes"] == 2048 and 0 < entry["eval"]["bpb"]["all"] < 8
  with open(os.path.join(zoo_dir, "xs", zoo.ZOO_JSON)) as f:
    assert json.load(f)["snapshots"] == entry["snapshots"]
  # cached: a second build does not train (a train call would fail here)
  monkeypatch.setattr(zoo, "train", lambda *a, **k: pytest.fail("retrained"))
  assert zoo.build(config_of, "xs", zoo_dir, 2048, 4, log=id)["snapshots"] == entry["snapshots"]
  assert "| xs | 6 |" in zoo.table([entry])

  # another config for the same name is refused, not silently re-used
  def other_seed(n, d, seed=0):
    return config_of(n, d, seed=1)

  with pytest.raises(ConfigError, match="trained with another config"):
    zoo.build(other_seed, "xs", zoo_dir, 2048, 4, log=id)


@pytest.mark.integration
def test_a_second_training_seed_is_its_own_model(tiny_zoo, config_of):
  """Seed k > 0 trains into ZOO_DIR/<name>_seed<k> from another initialisation and
  data order; the table names its seed; seed 0's cached entry is untouched."""
  zoo_dir, seed0 = tiny_zoo
  entry = zoo.build(config_of, "xs", zoo_dir, 2048, 4, log=id, seed=1)
  assert os.path.exists(os.path.join(zoo_dir, "xs_seed1", zoo.ZOO_JSON))
  assert entry["seed"] == 1 and entry["config"]["seed"] == 1
  assert set(entry["snapshots"].values()).isdisjoint(seed0["snapshots"].values())
  text = zoo.table([seed0, entry])
  assert "| xs | 6 |" in text and "| xs seed 1 | 6 |" in text
  assert zoo.verify(config_of, "xs", zoo_dir, log=id, seed=1)["bit_exact"]


@pytest.mark.parametrize(
  "study", ["pruning", "pruning_knee", "gemq", "codequant", "td_moe", "phenomena"]
)
def test_post_training_studies_run_over_training_seeds(study):
  """configs/studies/<study>.py:seeds=3 repeats the study on zoo-s at seeds 0, 1, 2;
  without the arg it is the one model of its settings."""
  from moejax.train.sweep import load_config_file

  path = f"configs/studies/{study}.py"
  over = load_config_file(f"{path}:seeds=3")
  assert over.models == [
    {"workdir": "runs/zoo/s"},
    {"workdir": "runs/zoo/s_seed1"},
    {"workdir": "runs/zoo/s_seed2"},
  ]
  plain = load_config_file(path)
  assert "models" not in plain and plain.settings.workdir == "runs/zoo/s"
  with pytest.raises(ConfigError, match="seeds=0 must be >= 1"):
    load_config_file(f"{path}:seeds=0")


@pytest.mark.integration
def test_verify_regenerates_bit_exactly(tiny_zoo, config_of):
  zoo_dir, _ = tiny_zoo
  result = zoo.verify(config_of, "xs", zoo_dir, log=id)
  assert result["bit_exact"] and result["first_difference"] is None
  assert result["snapshots"] == 2


def test_compare_snapshots_names_the_first_difference():
  a = {"3": "x", "6": "y", "9": "z"}
  assert zoo.compare_snapshots(a, dict(a))["bit_exact"]
  assert zoo.compare_snapshots(a, dict(a, **{"6": "w", "9": "w"}))["first_difference"] == "6"
  missing = zoo.compare_snapshots(a, {"3": "x", "6": "y"})
  assert not missing["bit_exact"] and missing["first_difference"] == "9"
  assert zoo.compare_snapshots(a, dict(a, **{"12": "q"}))["first_difference"] == "12"


def test_digest_reads_every_bit_of_every_leaf():
  rng = np.random.default_rng(0)
  params = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": {"c": np.ones(2, np.float32)}}
  rest = {"bias": np.zeros(4, np.float32)}
  digest = zoo.tree_digest(params, rest)
  assert zoo.tree_digest({"b": params["b"], "a": params["a"].copy()}, rest) == digest
  nudged = params["a"].copy()
  nudged[2, 3] = np.nextafter(nudged[2, 3], np.float32(np.inf))  # one ulp
  assert zoo.tree_digest(dict(params, a=nudged), rest) != digest
  assert zoo.tree_digest(params, {"bias": np.full(4, -0.0, np.float32)}) != digest  # sign bit
  assert zoo.tree_digest(params, {"other": rest["bias"]}) != digest  # the path counts


def test_zoo_configs():
  for name in zoo_configs.MODELS:
    c = zoo_configs.get_config(f"model={name}")
    assert c.data.name == "mix" and c.train.checkpoint_every * 10 == c.train.steps
  for size in ("s", "xs"):
    moe, dense = (zoo_configs.get_config(f"model={size}{twin}") for twin in ("", "_dense"))
    assert dense.model.ffn_type == "dense" and moe.model.ffn_type != "dense"
    assert dense.model.d_ff == moe.model.moe.top_k * moe.model.moe.expert_d_ff  # active width
    assert (dense.model.d_model, dense.model.num_layers, dense.train.steps) == (
      moe.model.d_model,
      moe.model.num_layers,
      moe.train.steps,
    )
  up = zoo_configs.get_config("model=s_upcycled")
  assert up.init.upcycle_step + up.train.steps == zoo_configs.get_config("model=s").train.steps
  assert zoo_configs.model_config("s_upcycled", "z", seed=2).init.upcycle_from == "z/s_dense_seed2"
  with pytest.raises(ConfigError, match="config arg model"):
    zoo_configs.get_config("model=m")


def test_table_of_two_entries():
  """The three tables, cell by cell (a probe without an accuracy shows a dash)."""

  def entry(name, seconds, bpb, accuracy, routing):
    return {
      "name": name,
      "steps": 600,
      "train_seconds": seconds,
      "tokens_per_second": 2051.6,
      "eval": {
        "bpb": bpb,
        "probes": {"copy": {"short": {"accuracy": accuracy, "n": 32}}},
        "routing": routing,
      },
    }

  layer = {
    "mutual_information_bits": 0.12345,
    "domain_entropy_bits": 2.5,
    "max_over_mean_load": 1.5,
  }
  text = zoo.table(
    [
      entry("xs", 678.0, {"code": 3.0512, "prose": 2.8419, "all": 2.6759}, 0.25, [layer]),
      entry("s", 60.0, {"code": 2.0, "prose": 1.5, "all": 1.75}, None, []),
    ]
  )

  def rule(n):
    return "|" + "---|" * n  # the separator row of an n-column table

  assert (
    text
    == "\n".join(
      [
        "| model | steps | train min | tokens/s | code | prose | all |",
        rule(7),
        "| xs | 600 | 11.3 | 2052 | 3.051 | 2.842 | 2.676 |",
        "| s | 600 | 1.0 | 2052 | 2.000 | 1.500 | 1.750 |",
        "",
        "| model | probe | group | accuracy (n) |",
        rule(4),
        "| xs | copy | short | 0.250 (32) |",
        "| s | copy | short | — (32) |",
        "",
        "| model | MoE layer | I(domain; expert) bits | of H(domain) | max/mean load |",
        rule(5),
        "| xs | 0 | 0.1235 | 2.5000 | 1.500 |",
      ]
    )
    + "\n"
  )
