"""What a router returns: the Routing of T tokens to S expert slots each, and the
RouterOutput around it that losses read.

Routing (the one contract between routers and dispatch)
-------------------------------------------------------
For T tokens a router returns S *slots* per token. Slot (t, s) holds
  expert_index[t, s]  int32   which expert, in [0, E)
  combine_weight[t,s] float32 the weight its output is mixed with
  valid[t, s]         bool    whether the assignment exists at all
Token-choice top-k uses S = k and every slot valid. Dynamic-k, token rounding
and capacity drops make some slots invalid. Expert choice uses S = E
(slot e is expert e, valid when expert e picked the token). An invalid slot
contributes nothing and costs no expert compute in the dropless path; its
expert_index and weight are ignored (by convention 0 and 0.0).
"""

import dataclasses
from collections.abc import Mapping
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Routing:
  """Fixed-slot routing of T tokens to S expert slots each (see module doc)."""

  expert_index: jax.Array  # int32 [T, S]
  combine_weight: jax.Array  # float32 [T, S]
  valid: jax.Array  # bool [T, S]
  # Static bound on the valid slots of all T tokens together, when a router can
  # prove one below T * S (token rounding: S = E slots, at most T*K + E*(M-1)
  # valid); dropless dispatch sizes its row buffer by it. None: T * S.
  max_valid: int | None = struct.field(pytree_node=False, default=None)

  @property
  def num_tokens(self) -> int:
    return self.expert_index.shape[0]

  @property
  def num_slots(self) -> int:
    return self.expert_index.shape[1]

  def masked_weight(self) -> jax.Array:
    """Combine weights with invalid slots zeroed."""
    return jnp.where(self.valid, self.combine_weight, 0.0)

  def expert_counts(self, num_experts: int) -> jax.Array:
    """Valid assignments per expert, int32 [E] (a scatter-add: no [T, S, E]
    one-hot, which at E = 4096 atomic experts would be gigabytes)."""
    return (
      jnp.zeros((num_experts,), jnp.int32)
      .at[self.expert_index.reshape(-1)]
      .add(self.valid.reshape(-1).astype(jnp.int32))
    )

  def with_valid(self, valid: jax.Array) -> "Routing":
    """The same routing with a new validity mask (used by capacity drops)."""
    return dataclasses.replace(self, valid=valid)


@struct.dataclass
class RouterOutput:
  """Everything a router reports for one layer call."""

  routing: Routing
  logits: jax.Array | None  # float32 [T, E], what z-loss reads (None: gives_probs=False)
  probs: jax.Array | None  # float32 [T, E], what balance losses read (None: gives_probs=False)
  metrics: Mapping[str, jax.Array]
  state: Mapping[str, jax.Array]  # updated non-trained router state
  # Accumulable statistics of this call (sums over its tokens) that
  # RouterSpec.update_state reads; empty for routers without the protocol.
  stats: Mapping[str, jax.Array] = struct.field(default_factory=dict)

  def over_experts(self, name: Literal["logits", "probs"]) -> jax.Array:
    """`logits` or `probs`, float32 [T, E]; ValueError for a router that gives
    neither (gives_probs=False: moejax/validation.py refuses losses on it)."""
    value = self.logits if name == "logits" else self.probs
    if value is None:
      raise ValueError(f"the router gives no {name} over all experts (gives_probs=False)")
    return value


def routing_entropy(probs: jax.Array) -> jax.Array:
  """Mean per-token entropy (nats) of a router's distribution over experts [T, E] (the
  routers' metric, moejax/routing/; RSL's terms, moejax/losses/rsl.py)."""
  p = jnp.clip(probs, 1e-30, 1.0)
  return jnp.mean(-jnp.sum(probs * jnp.log(p), axis=-1))
