"""The top-k router's own check: 1 <= top_k <= num_experts, both ends included."""

import pytest

from moejax.errors import ConfigError
from moejax.routing import router_config
from moejax.routing.topk import validate_top_k
from tests.helpers import moe_cfg


@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_top_k_from_one_to_num_experts_is_accepted(top_k):
  validate_top_k(router_config("topk", moe_cfg(num_experts=8, top_k=top_k)))


@pytest.mark.parametrize(
  "top_k,message",
  [
    (0, r"model.moe.top_k=0 must be >= 1"),
    (-1, r"model.moe.top_k=-1 must be >= 1"),
    (
      9,
      r"model.moe.top_k=9 must be <= "
      r"model.moe.num_experts=8",
    ),
  ],
)
def test_top_k_outside_is_refused(top_k, message):
  with pytest.raises(ConfigError, match=message):
    validate_top_k(router_config("topk", moe_cfg(num_experts=8, top_k=top_k)))
