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

Left out: the official router loss (a margin cross-entropy on the selected
scores) and its prototype loss on old keys, both weighted 1e-5 there, and the
dense warm-up of the first task (the continual-learning loop may set top_k = N);
experts start U(0, 1) as there (torch nn.init.uniform_). `assigned` replaces the
selection by given experts for every head (task-specific prompts, DualPrompt's
E-prompts with key matching, moejax/continual/prompt_experts.py).
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
    shape = (prefix_blocks(m, s), m.num_heads, n, m.head_dim)
    self.keys = nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32))
    self.values = nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32))
    self.counts = ExpertUsage(jnp.zeros(shape[:3], jnp.float32))
    self.frequent = ExpertUsage(jnp.zeros(shape[:3], bool))
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

  def attention_prefix(self, layer: int, train: bool):
    """Block `layer`'s hook for layers/attention.py prefixed_attention, or None past
    the blocks with experts."""
    if layer >= self.keys.shape[0]:
      return None

    def prefix(q_BxLxHxK):
      keys, values = self.keys[layer], self.values[layer]
      q = q_BxLxHxK.astype(jnp.float32)
      scores = proxy_scores(q, keys)
      index = self.selection(layer, scores, train)
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
    counted expert (sticky over tasks, the official used_frequently)."""
    counts = self.counts[...]
    used = jnp.maximum(jnp.sum(counts > 0, axis=-1, keepdims=True), 1)
    mean = jnp.sum(counts, axis=-1, keepdims=True) / used
    self.frequent[...] = self.frequent[...] | (counts >= mean)

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
  for key in ("penalty", "unused_penalty"):
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
