"""Reference dispatch implementations the MoE layer benchmark times the dispatch paths
against (experiments/benchmarks/moe_layer.py, paths anchor/*); moejax's own dispatchers
are in moejax/dispatch/."""

import jax
import jax.numpy as jnp

from moejax.dispatch.capacity import capacity_of


def gshard_einsum(x, routing, expert_fn, cfg):
  """GShard (Lepikhin et al. 2020) one-hot dispatch/combine tensors [T, E, C] and einsums."""
  num_tokens, num_slots = routing.expert_index.shape
  num_experts = cfg.num_experts
  capacity = capacity_of(cfg, num_tokens)
  one_hot = jax.nn.one_hot(routing.expert_index.T, num_experts) * routing.valid.T[..., None]
  # position of each assignment in its expert's buffer, slot-major priority
  position = jnp.cumsum(one_hot.reshape(-1, num_experts), 0).reshape(one_hot.shape) - 1
  position = jnp.sum(position * one_hot, -1)  # [S, T]
  kept = one_hot * (position < capacity)[..., None]  # [S, T, E]
  slot_one_hot = jax.nn.one_hot(position, capacity)  # [S, T, C]
  dispatch = jnp.einsum("ste,stc->tec", kept, slot_one_hot)
  weight = routing.masked_weight().T  # [S, T]
  combine = jnp.einsum("ste,stc,st->tec", kept, slot_one_hot, weight)
  rows = jnp.einsum("tec,td->ecd", dispatch, x)
  out = expert_fn(rows, lambda r, w: jnp.einsum("eca,eab->ecb", r, w))
  y = jnp.einsum("tec,ecd->td", combine, out)
  waste = (num_experts * capacity - jnp.sum(kept)) / jnp.maximum(jnp.sum(kept), 1)
  return y, {"padding_waste": waste}
