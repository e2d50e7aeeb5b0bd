"""Dropless dispatch (MegaBlocks, Gale et al. 2022): sort rows by expert, no capacity.

Layout (base.TileLayout): assignments are sorted by expert and each expert's
group of rows is padded to a multiple of `model.moe.dropless_tile` rows, so
every tile belongs to exactly one expert (tile = 1: no padding). Rows are
gathered from x by token (padding rows repeat token 0 and are never read
back); outputs are combined with a weighted scatter-add over rows. Padding
waste (padded rows / real rows) is reported relative to dropless_tile.
Invalid slots sort to the end and cost nothing.

The grouped matmul over that layout is `model.moe.grouped_matmul`, an entry
of the registry in grouped_matmul.py (loop, tiled, ragged_dot, gmm; 'fused':
the expert type's own fused path; 'gather': no layout at all, each (token,
slot) its own row, token_gather.py; 'auto'). Nothing here knows an expert type:
what an expert computes and whether it has a fused path is what its
registered ExpertType declares (moejax/experts/base.py).
"""

import jax.numpy as jnp

from moejax.assignment.layout import combine_rows, dropless_metrics, tile_layout
from moejax.dispatch.base import register_dispatcher
from moejax.dispatch.grouped_matmul import (
  GROUPED_MATMULS,  # noqa: F401  (re-exported)
  resolve_grouped_matmul,
)
from moejax.dispatch.memeff import dispatch_dropless_memeff
from moejax.dispatch.token_gather import token_gather_dispatch
from moejax.experts.base import experts_of


def get_grouped_matmul(name: str, expert_fn=None) -> str:
  """The grouped matmul `name` stands for ('auto' resolved for this platform and
  expert_fn); ConfigError naming model.moe.grouped_matmul if unknown."""
  return resolve_grouped_matmul(
    name, experts_of(expert_fn), config_key="model.moe.grouped_matmul"
  ).name


@register_dispatcher("dropless")
def dispatch_dropless(x, routing, expert_fn, cfg):
  spec = resolve_grouped_matmul(
    cfg.grouped_matmul,
    experts_of(expert_fn),
    config_key="model.moe.grouped_matmul",
    few_rows=routing.expert_index.size <= cfg.num_experts,
  )
  if spec.fused:
    return dispatch_dropless_memeff(x, routing, expert_fn, cfg)
  if spec.per_token:
    return token_gather_dispatch(jnp.asarray(x), routing, expert_fn)
  x = jnp.asarray(x)
  layout = tile_layout(routing, cfg.num_experts, cfg.dropless_tile)
  out = expert_fn(x[layout.row_token], spec.build(layout, cfg))
  return combine_rows(out, layout, routing, x.dtype), dropless_metrics(layout)
