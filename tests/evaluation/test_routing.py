"""Routing diagnostics on planted assignments, computed by hand."""

import math

import numpy as np
import pytest

from moejax.evaluation import routing


def h2(*p):
  return -sum(x * math.log2(x) for x in p if x)


def test_counts_skip_invalid_slots():
  experts = np.array([[0, 2], [1, -1], [2, 0]])
  counts = routing.domain_expert_counts(experts, np.array([0, 1, 1]), 2, 3)
  np.testing.assert_array_equal(counts, [[1, 0, 1], [1, 1, 1]])


def test_domain_aligned_experts_carry_all_of_h_domain():
  # 3 tokens of domain 0 on experts {0, 1}, 1 token of domain 1 on {2, 3}, top-2
  experts = np.array([[0, 1], [1, 0], [0, 1], [2, 3]])
  counts = routing.domain_expert_counts(experts, np.array([0, 0, 0, 1]), 2, 4)
  assert routing.mutual_information(counts) == pytest.approx(h2(0.75, 0.25), abs=1e-12)
  report = routing.routing_report([experts], np.array([0, 0, 0, 1]), ["a", "b"], [4])[0]
  assert report["mutual_information_bits"] == pytest.approx(report["domain_entropy_bits"])
  assert report["usage"] == {"a": [0.5, 0.5, 0, 0], "b": [0, 0, 0.5, 0.5]}


def test_independent_assignments_carry_none():
  counts = np.outer([1, 3, 2], [4, 1, 1, 2]).astype(float)
  assert routing.mutual_information(counts) == pytest.approx(0.0, abs=1e-12)


def test_small_case_by_hand():
  # p = [[1/4, 1/4], [0, 1/2]], p(d) = [1/2, 1/2], p(e) = [1/4, 3/4]
  mi = (
    0.25 * math.log2(0.25 / 0.125) + 0.25 * math.log2(0.25 / 0.375) + 0.5 * math.log2(0.5 / 0.375)
  )
  assert routing.mutual_information(np.array([[1.0, 1.0], [0.0, 2.0]])) == pytest.approx(
    mi, abs=1e-12
  )
  assert mi == pytest.approx(h2(0.25, 0.75) - 0.5 * h2(0.5, 0.5), abs=1e-12)  # H(E) - H(E|D)


def test_load_and_topk_set_change():
  assert routing.max_over_mean_load(np.array([[2.0, 1, 0, 0], [1, 0, 0, 0]])) == 3.0
  a = np.array([[1, 2], [1, 2], [0, 3], [0, -1]])
  b = np.array([[2, 1], [1, 3], [0, 3], [0, 1]])  # same set, changed, same, one slot more
  assert routing.topk_set_changed(a, b, 4) == 0.5
  assert routing.topk_set_changed(a, a[:, ::-1], 4) == 0.0
