"""Continual VQA with the calibrated Bayesian MoE (moejax/continual/bayesian_vqa.py): the
fused input's layout, the non-native statistic against a loop, which parameters the
backbone and the experts train, one-line refusals naming the key; and a tiny run whose
oracle arm never forgets, whose backbone stays bit for bit, and whose every arm is the
same whether scored alone or with the others (one training serves all)."""

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.continual import bayesian_vqa as bv
from moejax.data import sort_of_clevr as sc
from moejax.errors import ConfigError
from moejax.models.vit import VisionTransformer

TINY = bv.VQASetup(
  train_rows=24, memory=8, test_rows=8, pretrain_rows=32, d_model=16, layers=1, heads=2,
  head_dim=8, d_ff=16, rank=2, pretrain_steps=2, steps_per_task=2, batch=8, router_steps=5,
)  # fmt: skip


def test_the_question_is_broadcast_to_every_pixel_after_the_colours():
  images, questions, _ = sc.sort_of_clevr("train", ("shape", "count"), 3, seed=0)
  x = bv.fused(images, questions)
  assert x.shape == (6, 12, 12, 3 + sc.QUESTION_DIM) and x.dtype == np.float32
  np.testing.assert_array_equal(x[..., :3], images)
  for row, question in zip(x, questions):
    np.testing.assert_array_equal(row[..., 3:], np.broadcast_to(question, (12, 12, 12)))


def test_non_native_better_against_a_loop():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.ones(5), (3, 40))  # [expert, row, answer]
  labels, native = rng.integers(0, 5, 40), rng.integers(0, 3, 40)
  count = 0
  for i in range(40):
    own = probs[native[i], i, labels[i]]
    count += any(probs[e, i, labels[i]] > own for e in range(3) if e != native[i])
  assert bv.non_native_better(probs, labels, native) == count / 40


def test_the_backbone_trains_all_but_the_lora_and_an_expert_only_its_lora_and_head():
  model = VisionTransformer(bv.model_config(TINY), rngs=nnx.Rngs(0))

  def paths(selection):
    state = nnx.state(model, selection)
    return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)}

  adapter, backbone = paths(bv.ADAPTER), paths(bv.BACKBONE)
  head = {p for p in adapter if p.startswith("['head']")}
  assert len(head) == 2 and adapter & backbone == head  # the head: pretrained, then per expert
  assert all("lora_a" in p or "lora_b" in p for p in adapter - head)
  assert any("lora_b" in p for p in adapter) and not any("router_kernel" in p for p in adapter)
  assert not any("adapter" in p for p in backbone) and any("patch_embed" in p for p in backbone)
  for p, b in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.PathContains("lora_b"))):
    np.testing.assert_array_equal(np.asarray(b), 0)  # the expert starts as the base


@pytest.mark.parametrize(
  "change, name",
  [
    ({"lam": -0.5}, "bayesian_vqa.lam=-0.5"),
    ({"memory": 24}, "bayesian_vqa.memory=24"),
    ({"patch": 5}, "bayesian_vqa.patch=5"),
    ({"n_bins": 0}, "bayesian_vqa.n_bins=0"),
    ({"router_lr": 0}, "bayesian_vqa.router_lr=0"),
    ({"rank": True}, "bayesian_vqa.rank=True"),
  ],
)
def test_a_bad_setup_is_refused_in_one_line_naming_the_key(change, name):
  import dataclasses

  with pytest.raises(ConfigError) as error:
    dataclasses.replace(TINY, **change).check()
  assert "\n" not in str(error.value) and name in str(error.value)


@pytest.mark.integration
def test_a_tiny_stream_scores_every_routing_on_one_training():
  backbone, data = bv.prepared_draw(TINY, 3, tasks=("shape", "left", "count"))
  before = [np.asarray(w) for w in jax.tree.leaves(nnx.state(backbone))]
  out = bv.run_stream(TINY, data, backbone, 3)
  after = [np.asarray(w) for w in jax.tree.leaves(nnx.state(backbone))]
  assert all(np.array_equal(a, b) for a, b in zip(before, after))
  oracle = out["oracle_task"]
  assert oracle["native_mass"] == 1.0 and oracle["routing_entropy"] == 0.0
  assert oracle["forgetting"] == 0.0  # frozen experts, always the right one
  a = np.asarray(oracle["accuracy"])
  for j in range(3):
    np.testing.assert_array_equal(a[j:, j], a[j, j])
  assert out["hard_task"]["routing_entropy"] == 0.0
  assert out["bayes"]["routing_entropy"] > 0.0
  assert 0 <= out["non_native_better"] <= 1
  for r in bv.ROUTINGS:
    assert 0 <= out[r]["ece"] <= 1 and np.isnan(out[r]["accuracy"][0][1])
  alone = bv.run_stream(TINY, data, backbone, 3, routings=("bayes",))
  np.testing.assert_array_equal(alone["bayes"].pop("accuracy"), out["bayes"].pop("accuracy"))
  assert alone["bayes"] == out["bayes"]
  with pytest.raises(ConfigError, match="'nope'"):
    bv.run_stream(TINY, data, backbone, 3, routings=("nope",))
