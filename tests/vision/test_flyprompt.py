"""FlyPrompt on the class-incremental stream (moejax/continual/flyprompt.py): blurry task
rows against their definition, a new expert is the mean of the earlier ones, and a tiny
run whose REAR routing equals ridge solved by least squares on the collected frozen
features, whose oracle router is exact and whose backbone stays bit for bit; one-line
refusals naming the key."""

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.continual import flyprompt as fp
from moejax.continual import prompt_experts as pe
from moejax.data.class_stream import blurry_task_rows, task_rows
from moejax.errors import ConfigError
from moejax.models.vit import VisionTransformer

SETUP = pe.Setup(
  d_model=16, layers=2, heads=2, head_dim=8, d_ff=16, experts=6, top_k=1, blocks=1,
  pretrain_steps=2, pretrain_lr=1e-3, steps_per_task=2, warmup=0, batch=8, lr=1e-2,
)  # fmt: skip


def test_blurry_rows_move_a_fraction_of_each_task_to_its_neighbours_only():
  labels = np.random.default_rng(0).integers(0, 8, 400)
  tasks = [[0, 1], [2, 3], [4, 5], [6, 7]]
  own = task_rows(labels, tasks)
  assert [r.tolist() for r in blurry_task_rows(labels, tasks, 0.0, 0)] == [r.tolist() for r in own]
  got = blurry_task_rows(labels, tasks, 0.3, 5)
  every = np.sort(np.concatenate(got))
  np.testing.assert_array_equal(every, np.arange(400))  # each row in exactly one task
  home = {c: t for t, classes in enumerate(tasks) for c in classes}
  for t, rows in enumerate(got):
    foreign = [home[int(labels[i])] for i in rows if home[int(labels[i])] != t]
    assert set(foreign) <= {t - 1, t + 1} and foreign
    assert np.all(np.diff(rows) > 0)
    left = sum(home[int(labels[i])] == t for i in rows)
    assert len(own[t]) - left == round(0.3 * len(own[t]))


@pytest.mark.parametrize("fraction", [1.0, -0.1, True, "0.1"])
def test_a_bad_blurry_fraction_is_refused_in_one_line(fraction):
  with pytest.raises(ConfigError) as error:
    blurry_task_rows(np.arange(4) % 2, [[0], [1]], fraction, 0)
  message = str(error.value)
  assert "\n" not in message and f"blurry_fraction={fraction!r}" in message


def test_a_new_expert_starts_as_the_mean_of_the_earlier_ones():
  model = VisionTransformer(pe.model_config(SETUP, 4, fp.METHOD, 3), rngs=nnx.Rngs(0))
  prompt, per_task = model.prompt, 2
  rng = np.random.default_rng(0)
  for table in (prompt.keys, prompt.values):
    table[...] = rng.standard_normal(table.shape).astype(np.float32)
  before = [np.asarray(t[...]) for t in (prompt.keys, prompt.values)]
  fp.start_from_mean(prompt, 0, per_task)  # the first expert keeps its initialisation
  for table, old in zip((prompt.keys, prompt.values), before):
    np.testing.assert_array_equal(np.asarray(table[...]), old)
  fp.start_from_mean(prompt, 1, per_task)
  fp.start_from_mean(prompt, 2, per_task)
  for table, old in zip((prompt.keys, prompt.values), before):
    new = np.asarray(table[...])
    np.testing.assert_array_equal(new[:, :, :2], old[:, :, :2])  # expert 0 untouched
    np.testing.assert_array_equal(new[:, :, 2:4], old[:, :, 0:2])  # mean of one expert
    np.testing.assert_array_equal(new[:, :, 4:6], (old[:, :, 0:2] + old[:, :, 0:2]) / 2)


def test_the_routing_matrix_counts_each_task_s_images_by_expert():
  truth = np.array([0, 0, 0, 1, 1, 2])
  routed = np.array([0, 1, 1, 1, 1, 0])
  want = [[1 / 3, 2 / 3, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
  np.testing.assert_allclose(fp.routing_matrix(truth, routed, 4), want, atol=1e-15)


def test_the_mean_is_over_every_earlier_expert_position_by_position():
  model = VisionTransformer(pe.model_config(SETUP, 4, fp.METHOD, 3), rngs=nnx.Rngs(0))
  keys = np.random.default_rng(1).standard_normal(model.prompt.keys.shape).astype(np.float32)
  model.prompt.keys[...] = keys
  fp.start_from_mean(model.prompt, 2, 2)
  np.testing.assert_array_equal(
    np.asarray(model.prompt.keys[...])[:, :, 4:6], (keys[:, :, 0:2] + keys[:, :, 2:4]) / 2
  )
  np.testing.assert_array_equal(np.asarray(model.prompt.keys[...])[:, :, :4], keys[:, :, :4])


def tiny_stream():
  rng = np.random.default_rng(0)
  data = (rng.random((60, 8, 8, 1), np.float32), np.arange(60) % 6)
  data += (rng.random((30, 8, 8, 1), np.float32), np.arange(30) % 6)
  return pe.prepared_draw(SETUP, 0, 2, data)


@pytest.mark.integration
def test_a_tiny_run_routes_by_ridge_on_the_frozen_features_and_keeps_the_backbone():
  backbone, stream, tasks = tiny_stream()
  want_backbone = jax.tree.leaves(nnx.state(backbone, pe.BACKBONE))
  fly = fp.FlySetup(width=24, ridge=0.5, blurry=0.2)
  out = fp.run_flyprompt(SETUP, fly, backbone, stream, tasks, 0)
  train_x, train_y, test_x, test_y = stream
  frozen = pe.feature_fn(SETUP, backbone)
  rows = blurry_task_rows(train_y, tasks, 0.2, 0)
  f = np.concatenate([frozen(train_x[r]) for r in rows]).astype(np.float64)
  expert = np.concatenate([np.full(len(r), t) for t, r in enumerate(rows)])
  truth = np.concatenate([np.full(len(r), t) for t, r in enumerate(task_rows(test_y, tasks))])
  truth = truth[np.argsort(np.concatenate(task_rows(test_y, tasks)))]
  w_rand = np.random.default_rng(0).standard_normal((SETUP.d_model, 24))
  expanded = np.maximum(f @ w_rand, 0)
  matched = 0.5 * (np.sum(f**2) / SETUP.d_model) / (np.sum(expanded**2) / 24)
  cases = (
    ("rear", lambda x: np.maximum(x @ w_rand, 0), 0.5),
    ("ridge", lambda x: x, 0.5),
    ("ridge_matched", lambda x: x, matched),
  )
  for name, h_of, gamma in cases:
    h = h_of(f)
    m = h.shape[1]
    a = np.concatenate([h, np.sqrt(gamma) * np.eye(m)])
    b = np.concatenate([np.eye(3)[expert], np.zeros((m, 3))])
    weights = np.linalg.lstsq(a, b, rcond=None)[0]
    guess = np.argmax(h_of(frozen(test_x).astype(np.float64)) @ weights, -1)
    assert out[name]["routing_accuracy"] == pytest.approx(np.mean(guess == truth), abs=1e-12)
    counted = [[np.mean(guess[truth == i] == j) for j in range(3)] for i in range(3)]
    np.testing.assert_allclose(out[name]["routing_matrix"], counted, atol=1e-12)
  assert out["oracle"]["routing_accuracy"] == 1.0
  np.testing.assert_array_equal(out["oracle"]["routing_matrix"], np.eye(3))
  for r in fp.ROUTERS:
    a = np.asarray(out[r]["accuracy"])
    assert np.isnan(a[np.triu_indices(3, 1)]).all() and not np.isnan(np.tril(a)).any()
    assert out[r]["final_accuracy"] == pytest.approx(a[-1].mean())
  got = jax.tree.leaves(nnx.state(out["model"], pe.BACKBONE))
  for x, y in zip(want_backbone, got, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
  "fly, names",
  [
    (fp.FlySetup(blurry=1.0), ["flyprompt.blurry=1.0"]),
    (fp.FlySetup(ridge=-1.0), ["flyprompt.ridge=-1.0"]),
    (fp.FlySetup(width=-2), ["flyprompt.width=-2"]),
    (fp.FlySetup(decays=(0.9, 1.5)), ["flyprompt.decays[1]=1.5"]),
  ],
)
def test_bad_flyprompt_settings_are_refused_in_one_line_naming_the_key(fly, names):
  with pytest.raises(ConfigError) as error:
    fly.check()
  message = str(error.value)
  assert "\n" not in message and all(n in message for n in names), message
