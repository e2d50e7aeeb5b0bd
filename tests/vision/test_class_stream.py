"""The class-incremental stream (moejax/data/class_stream.py) against hand-built tasks and
a brute-force row filter, its one-line refusals, and the continual-learning metrics and
frozen backbone of moejax/continual/prompt_experts.py."""

import jax
import numpy as np
import pytest
from flax import nnx

from moejax.continual import prompt_experts
from moejax.data.class_stream import class_incremental_tasks, shuffled_class_order, task_rows
from moejax.errors import ConfigError


def test_tasks_are_consecutive_groups_of_the_class_order_and_rows_follow_labels():
  tasks = class_incremental_tasks([3, 7, 0, 5, 1, 2], 2)
  assert tasks == [[3, 7], [0, 5], [1, 2]]
  labels = np.random.default_rng(0).integers(0, 8, 50)
  rows = task_rows(labels, tasks)
  for classes, got in zip(tasks, rows):
    assert got.tolist() == [i for i, y in enumerate(labels) if y in classes]


def test_the_shuffled_order_is_a_permutation_fixed_by_the_seed():
  order = shuffled_class_order(10, 3)
  assert sorted(order) == list(range(10)) and order == shuffled_class_order(10, 3)
  assert order != shuffled_class_order(10, 4)


@pytest.mark.parametrize(
  "order, per_task, names",
  [
    ([1, 2, 2, 3], 2, ["class_order=[1, 2, 2, 3]", "repeats classes [2]"]),
    ([1, 2, 3], 2, ["classes_per_task=2", "3 classes of class_order"]),
    ([1, 2], 0, ["classes_per_task=0"]),
  ],
)
def test_a_bad_stream_is_refused_in_one_line_naming_the_key(order, per_task, names):
  with pytest.raises(ConfigError) as error:
    class_incremental_tasks(order, per_task)
  message = str(error.value)
  assert "\n" not in message and all(name in message for name in names), message


def test_forgetting_is_the_best_earlier_accuracy_minus_the_final_one():
  nan = float("nan")
  accuracy = [[0.9, nan, nan], [0.7, 0.8, nan], [0.5, 0.9, 0.6]]
  # task 0: max(0.9, 0.7) - 0.5 = 0.4; task 1: 0.8 - 0.9 = -0.1
  assert prompt_experts.forgetting(accuracy) == pytest.approx((0.4 - 0.1) / 2)


@pytest.mark.integration
def test_a_stream_trains_prompts_and_head_and_leaves_the_backbone_bit_for_bit():
  s = prompt_experts.Setup(
    d_model=16, layers=2, heads=2, head_dim=8, d_ff=16, experts=4, top_k=2, blocks=1,
    pretrain_steps=2, pretrain_lr=1e-3, steps_per_task=2, warmup=1, batch=8, lr=1e-2,
  )  # fmt: skip
  rng = np.random.default_rng(0)
  data = (rng.random((40, 8, 8, 1), np.float32), np.arange(40) % 4)
  data += (rng.random((20, 8, 8, 1), np.float32), np.arange(20) % 4)
  backbone, stream, tasks = prompt_experts.prepared_draw(s, 0, 2, data)
  want = jax.tree.leaves(nnx.state(backbone, prompt_experts.BACKBONE))
  for method in ("smope", "task_prompts"):
    out = prompt_experts.run_stream(method, s, backbone, stream, tasks, 0)
    assert np.isnan(out["accuracy"][0][1]) and out["prompt_params"] > 0
    assert out["forgetting"] == pytest.approx(out["accuracy"][0][0] - out["accuracy"][1][0])
    got = jax.tree.leaves(nnx.state(out["model"], prompt_experts.BACKBONE))
    assert len(got) == len(want)
    for a, b in zip(want, got):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
