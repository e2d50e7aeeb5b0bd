"""teacher-MoE regression (issue 13, part 5): matched purity on planted labels,
the noise floor, and the teacher's routing."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.analysis import teacher_moe as tm


def test_matched_purity_on_planted_assignments():
  teacher = np.array([0, 0, 0, 1, 1, 2, 2, 2])
  assert tm.matched_purity(teacher, np.array([3, 3, 3, 0, 0, 1, 1, 1])) == 1.0
  # One student expert for everything: one teacher expert (the largest, 3 of 8) matches.
  assert tm.matched_purity(teacher, np.zeros(8, int)) == 3 / 8
  # Counts (teacher rows x student columns) [[2, 1], [0, 2], [3, 0]]: greedy per
  # student expert would take teacher 2 (3) and teacher 0 or 1 (2); the best
  # one-to-one matching is teacher 2 -> 0, teacher 1 -> 1: 5 of 8.
  student = np.array([0, 0, 1, 1, 1, 0, 0, 0])
  assert tm.matched_purity(teacher, student) == 5 / 8
  # A many-to-one student is not credited twice: 2 student experts split teacher 0.
  assert tm.matched_purity([0, 0, 1, 1], [0, 1, 2, 2]) == 3 / 4


def test_teacher_samples_have_the_drawn_noise_as_floor():
  s = dataclasses.replace(tm.Settings(), noise=0.5)
  teacher = tm.make_teacher(s, 0)
  data = tm.sample(teacher, s, 512, seed=3)
  assert data["x"].shape == data["clean"].shape == (512, s.d_model)
  assert tm.noise_floor(data) == pytest.approx(float(jnp.mean(data["noise"] ** 2)))
  assert tm.noise_floor(data) == pytest.approx(0.25, rel=0.1)  # std 0.5
  # The sharpened gate uses every expert and its top-1 is the argmax of x W.
  expected = np.argmax(np.asarray(data["x"] @ teacher.router_kernel[...]), axis=1)
  np.testing.assert_array_equal(data["expert"], expected)
  assert set(data["expert"]) == set(range(s.num_experts))
