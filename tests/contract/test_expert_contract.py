"""Every registered expert type through every dispatcher and every grouped
matmul (and every distinct gmm kernel backend that runs here) against the
per-token loop: forward output and gradients w.r.t. x, the expert weights and
the combine weights (oracles.check_dispatch). Cases come from the registries,
so a newly registered part is covered without editing this file."""

import pytest

from moejax.dispatch import DISPATCHERS
from moejax.dispatch.grouped_matmul import GROUPED_MATMULS, resolve_grouped_matmul
from moejax.experts import EXPERT_TYPES
from tests.contract.dispatch_oracles import MATMUL_HOST, cases
from tests.contract.oracles import check_dispatch, check_expert_type

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)

CASES = [(name, *case) for name, spec in EXPERT_TYPES.items() for case in cases(spec)]


@pytest.mark.parametrize("expert_type", list(EXPERT_TYPES))
def test_expert_type_builds_what_it_declares(expert_type):
  check_expert_type(EXPERT_TYPES.get(expert_type))


@pytest.mark.parametrize(
  "expert_type,dispatcher,matmul,backend",
  CASES,
  ids=["-".join(filter(None, case)) for case in CASES],
)
def test_dispatch_equals_per_token_loop_with_gradients(expert_type, dispatcher, matmul, backend):
  overrides = {} if backend is None else {"gmm": {"backend": backend}}
  check_dispatch(EXPERT_TYPES.get(expert_type), dispatcher, matmul, **overrides)


def test_every_registered_part_is_a_case():
  for name, spec in EXPERT_TYPES.items():
    covered = {(d, resolve_grouped_matmul(m, spec.bind({})).name) for d, m, _ in cases(spec)}
    assert {d for d, _ in covered} == set(DISPATCHERS), name
    assert {m for d, m in covered if d == MATMUL_HOST} == {
      resolve_grouped_matmul(m, spec.bind({})).name for m in GROUPED_MATMULS
    }, name
