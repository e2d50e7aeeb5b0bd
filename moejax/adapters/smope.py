"""SMoPE ("Sparse Mixture of Prompt Experts", ICLR, arXiv 2509.24483): one shared prefix
of N prompt experts, each input attending to the K its proxy score selects.

The experts are prefix-tuning key/value pairs inside the attention of the first
`blocks` blocks (0: the first half; model.vit.prompt.num_tokens = N; no sequence
slots), one pair per expert and query head h: p_j^K, p_j^V in R^{head_dim}. For
block input tokens with queries q_l (l = 1..L, CLS included), head h:

    s_j = (x_bar W_Q) . p_j^K = (1/L) sum_l q_l . p_j^K        the proxy score
                                x_bar W_Q = mean_l q_l: the logit is linear in q
    S   = top-K_j (s_j - c_j (max_i s_i - min_i s_i))          per image and head
    out_l = softmax([z_l,S ; q_l . K / sqrt(d)]) [P^V_S ; V]   one softmax over the
                                                                K experts and the tokens

with prompt logits z_l,j = s_j for every query (proxy_logits, as the official code:
the selected experts' logits are the proxy scores, which is the compute saving), or
q_l . p_j^K (proxy_logits=False: per-query prefix tuning). K = N is dense prefix
tuning over all experts. The spread max - min is a constant for the gradient, so
an expert that is not selected gets no gradient.

Expert usage (from the official code, models/zoo.py OnePrompt and models/vit.py,
not the paper text): after each task the top-K choices of the raw score s on the
task's training data are counted per (block, head, expert) (`count_selections`,
then `end_task`). Training a later task subtracts c_j = penalty (0.4) times the
spread from experts that earlier tasks used at least as often as their head's mean
used expert (`frequent`, sticky), pushing new tasks to other experts; evaluation
subtracts unused_penalty (2.0) times the spread from experts never counted, so
they are never chosen. The "adaptive noise" of our spec is this deterministic offset.

The official router losses (models/zoo.py router_loss; not in the paper's text), added
to the model's aux_loss in training when selecting K < N experts:

  margin loss     mu_router * sum_h sum_{j in S} mean_b CE(s + eps (max s - min s) 1[not S], j)
                  the unselected experts' scores lifted by eps times the spread (eps =
                  `penalty`, as there): each selected expert must win by that margin.
  old-key loss    mu_router_old * sum_h sum_{i <= K} mean_{u frequent} CE(o_u . P^K, top_i(o_u . O))
                  once a task has ended (`end_task` keeps the keys O): the old keys o_u of
                  the frequent experts must keep ranking the current keys P^K as they
                  ranked the old ones (the prototype loss). A head with no frequent
                  expert adds 0 (the official mean over no rows is NaN).

Both weights default to the official 1e-5 (`router_weight`, `old_key_weight`). The
dense warm-up of the first task is the continual-learning loop's (top_k = N: no router
loss then, our choice); experts start U(0, 1) as there (torch nn.init.uniform_).
`assigned` replaces the selection by given experts for every head (task-specific
prompts, DualPrompt's E-prompts with key matching, moejax/continual/prompt_experts.py).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.adapters.base import ADAPTERS, AdapterSpec
from moejax.errors import ConfigError

SETTINGS = (
  ("top_k", 2),  # 5 of N = 25 officially
  ("blocks", 0),  # 0: the first half of the blocks, rounded up (6 of 12 officially)
  ("penalty", 0.4),
  ("unused_penalty", 2.0),
  ("proxy_logits", True),
  ("router_weight", 1e-5),  # mu_router, the margin router loss
  ("old_key_weight", 1e-5),  # mu_router_old, the old-key prototype loss
)


class ExpertUsage(nnx.Variable):
  """Selection counts and flags from finished tasks: state, never trained."""


def prefix_blocks(m, s: dict) -> int:
  """The blocks with experts, the first ones: model.vit.prompt.smope.blocks, 0 for half."""
  return s["blocks"] or -(-m.num_layers // 2)


def proxy_scores(q_BxLxHxK, keys_HxNxK):
  """s [B, H, N] = (mean_l q_l) . p_j^K: the mean over the L queries of their prompt
  logits (before the 1/sqrt(d) scale)."""
  return jnp.einsum("bhk,hnk->bhn", jnp.mean(q_BxLxHxK, axis=1), keys_HxNxK)


def top_experts(scores_BxHxN, offset_BxHxN, top_k: int):
  """[B, H, K] indices of the K largest s - offset * (max - min), the spread per image
  and head held constant."""
  spread = jax.lax.stop_gradient(
    jnp.max(scores_BxHxN, -1, keepdims=True) - jnp.min(scores_BxHxN, -1, keepdims=True)
  )
  return jax.lax.top_k(scores_BxHxN - offset_BxHxN * spread, top_k)[1]


def margin_router_loss(scores_BxHxN, index_BxHxK, margin: float):
  """sum over heads and selected experts j of mean_b CE(s + margin * spread * 1[not
  selected], j): the official router loss before its weight (module doc)."""
  n = scores_BxHxN.shape[-1]
  spread = jax.lax.stop_gradient(
    jnp.max(scores_BxHxN, -1, keepdims=True) - jnp.min(scores_BxHxN, -1, keepdims=True)
  )
  selected = jnp.sum(jax.nn.one_hot(index_BxHxK, n, dtype=jnp.float32), axis=-2) > 0
  lifted = scores_BxHxN + margin * spread * (~selected).astype(jnp.float32)
  log_p = jax.nn.log_softmax(lifted, axis=-1)
  return -jnp.sum(jnp.mean(jnp.take_along_axis(log_p, index_BxHxK, axis=-1), axis=0))


def old_key_loss(keys_HxNxK, old_keys_HxNxK, frequent_HxN, top_k: int):
  """sum over heads and i <= K of the mean over frequent experts u of CE(o_u . P^K,
  i-th largest o_u . O): the official prototype loss before its weight (module doc)."""
  old_keys = jax.lax.stop_gradient(old_keys_HxNxK)
  targets = jax.lax.top_k(jnp.einsum("hud,hnd->hun", old_keys, old_keys), top_k)[1]
  log_p = jax.nn.log_softmax(jnp.einsum("hud,hnd->hun", old_keys, keys_HxNxK), axis=-1)
  per_row = -jnp.sum(jnp.take_along_axis(log_p, targets, axis=-1), axis=-1)  # [H, N]
  rows = frequent_HxN.astype(jnp.float32)
  return jnp.sum(jnp.sum(per_row * rows, -1) / jnp.maximum(jnp.sum(rows, -1), 1.0))


def gather_experts(table_HxNxK, index_BxHxK):
  """[B, H, K, d]: the rows `index` of each head's table."""
  return jnp.take_along_axis(table_HxNxK[None], index_BxHxK[..., None], axis=2)


class SparsePromptExperts(nnx.Module):
  """Key/value prompt experts [blocks, heads, N, head_dim] (module doc)."""

  def __init__(self, m, s: dict, *, rngs: nnx.Rngs):
    self.num_tokens = 0  # no sequence slots: the experts live inside the attention
    self.num_experts = n = m.vit.prompt.num_tokens
    self.top_k, self.proxy_logits = s["top_k"], s["proxy_logits"]
    self.penalty, self.unused_penalty = s["penalty"], s["unused_penalty"]
    self.router_weight, self.old_key_weight = s["router_weight"], s["old_key_weight"]
    shape = (prefix_blocks(m, s), m.num_heads, n, m.head_dim)
    self.keys = nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32))
    self.values = nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32))
    self.counts = ExpertUsage(jnp.zeros(shape[:3], jnp.float32))
    self.frequent = ExpertUsage(jnp.zeros(shape[:3], bool))
    self.old_keys = ExpertUsage(jnp.zeros(shape, jnp.float32))  # the keys at the last end_task
    self.counting = False  # count_selections: add each call's raw top-K to `counts`
    self.assigned = ExpertUsage(jnp.zeros((1, 0), jnp.int32))  # [B or 1, K] or empty

  def __call__(self, layer: int, patches_BxPxD):
    """No tokens in the sequence (moejax/adapters/base.py place_prompts)."""
    return None

  def offset(self, layer: int, train: bool):
    """c [H, N] of the module doc: penalty on frequent experts in training, on unused
    ones in evaluation."""
    if train:
      return self.penalty * self.frequent[layer].astype(jnp.float32)
    return self.unused_penalty * (self.counts[layer] == 0).astype(jnp.float32)

  def selection(self, layer: int, scores_BxHxN, train: bool):
    """[B, H, K] experts, or None for all N in order (K = N, nothing assigned)."""
    b, h, n = scores_BxHxN.shape
    if self.assigned.shape[1]:
      return jnp.broadcast_to(self.assigned[...][:, None], (b, h, self.assigned.shape[1]))
    if self.counting:
      raw = jax.lax.top_k(scores_BxHxN, self.top_k)[1]
      counts = jnp.sum(jax.nn.one_hot(raw, n, dtype=jnp.float32), axis=(0, 2))
      self.counts[...] = self.counts[...].at[layer].add(counts)
    if self.top_k >= n:
      return None
    offset = jnp.broadcast_to(self.offset(layer, train), scores_BxHxN.shape)
    return top_experts(scores_BxHxN, offset, self.top_k)

  def router_loss(self, layer: int, scores_BxHxN, index_BxHxK):
    """Block `layer`'s weighted router losses in training (module doc)."""
    loss = jnp.zeros((), jnp.float32)
    if self.router_weight:
      loss += self.router_weight * margin_router_loss(scores_BxHxN, index_BxHxK, self.penalty)
    if self.old_key_weight:
      loss += self.old_key_weight * old_key_loss(
        self.keys[layer], self.old_keys[layer], self.frequent[layer], self.top_k
      )
    return loss

  def attention_prefix(self, layer: int, train: bool, losses: list | None = None):
    """Block `layer`'s hook for layers/attention.py prefixed_attention, or None past
    the blocks with experts. In training with K < N selected by the proxy score, the
    hook appends the block's weighted router losses to `losses` (when given)."""
    if layer >= self.keys.shape[0]:
      return None

    def prefix(q_BxLxHxK):
      keys, values = self.keys[layer], self.values[layer]
      q = q_BxLxHxK.astype(jnp.float32)
      scores = proxy_scores(q, keys)
      index = self.selection(layer, scores, train)
      if train and losses is not None and index is not None and not self.assigned.shape[1]:
        losses.append(self.router_loss(layer, scores, index))
      if index is None:
        chosen = scores
        keys_BxHxKxD = jnp.broadcast_to(keys[None], (q.shape[0], *keys.shape))
        values_BxHxKxD = jnp.broadcast_to(values[None], (q.shape[0], *values.shape))
      else:
        chosen = jnp.take_along_axis(scores, index, axis=2)
        keys_BxHxKxD, values_BxHxKxD = gather_experts(keys, index), gather_experts(values, index)
      if self.proxy_logits:
        b, length = q.shape[:2]
        logits = jnp.broadcast_to(chosen[:, :, None], (b, chosen.shape[1], length, chosen.shape[2]))
      else:
        logits = jnp.einsum("blhk,bhpk->bhlp", q, keys_BxHxKxD)
      return logits, values_BxHxKxD

    return prefix

  def count_selections(self, on: bool = True) -> None:
    """Count the raw top-K of every following call (False: stop)."""
    self.counting = on

  def end_task(self) -> None:
    """Mark as frequent the experts counted at least as often as their head's mean
    counted expert (sticky over tasks, the official used_frequently), and keep the
    keys as the old keys of the prototype loss."""
    counts = self.counts[...]
    used = jnp.maximum(jnp.sum(counts > 0, axis=-1, keepdims=True), 1)
    mean = jnp.sum(counts, axis=-1, keepdims=True) / used
    self.frequent[...] = self.frequent[...] | (counts >= mean)
    self.old_keys[...] = self.keys[...]

  def assign(self, experts_BxK) -> None:
    """Use these experts for every head instead of the proxy selection ([B or 1, K]);
    an empty [1, 0] array restores the selection."""
    self.assigned = ExpertUsage(
      jnp.asarray(experts_BxK, jnp.int32).reshape(-1, experts_BxK.shape[-1])
    )


def validate(s: dict, m) -> None:
  n = m.vit.prompt.num_tokens
  k = s["top_k"]
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ConfigError(f"model.vit.prompt.smope.top_k={k!r} must be an int >= 1")
  if k > n:
    raise ConfigError(
      f"model.vit.prompt.smope.top_k={k} selects more experts than "
      f"model.vit.prompt.num_tokens={n} holds"
    )
  blocks = s["blocks"]
  if isinstance(blocks, bool) or not isinstance(blocks, int) or not 0 <= blocks <= m.num_layers:
    raise ConfigError(
      f"model.vit.prompt.smope.blocks={blocks!r} must be an int in [0 (half), "
      f"model.num_layers={m.num_layers}]"
    )
  for key in ("penalty", "unused_penalty", "router_weight", "old_key_weight"):
    if isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] < 0:
      raise ConfigError(f"model.vit.prompt.smope.{key}={s[key]!r} must be a number >= 0")
  if not isinstance(s["proxy_logits"], bool):
    raise ConfigError(
      f"model.vit.prompt.smope.proxy_logits={s['proxy_logits']!r} must be True or False"
    )
  if m.remat != "none":
    raise ConfigError(
      f"model.remat={m.remat!r}: model.vit.prompt.adapter='smope' runs its blocks "
      "without rematerialisation (give 'none')"
    )
  if m.attention.kind == "mla":
    raise ConfigError(
      "model.attention.kind='mla': model.vit.prompt.adapter='smope' puts key/value "
      "prefixes in grouped-query attention (give 'gqa')"
    )


ADAPTERS.add(
  "smope",
  AdapterSpec(
    build=lambda m, settings, rngs: SparsePromptExperts(m, settings, rngs=rngs),
    settings=SETTINGS,
    validate=validate,
    per_block=True,
  ),
)
