r"""L3, the Large Lookup Layer (Tseng & De Sa, arXiv 2601.21461).

A sparse layer with *static* routing by token id (no router, no aux loss).
Token id t owns d_t rows of a key table K and a value table V; for the hidden
state x of a token with id t (Sec. 3 of the paper, with x̂ = RMSNorm(x)):

    a   = softmax(K_t x̂)                 K_t in R^{d_t x d_in}   (eq. 1)
    h   = LayerNorm(W_up V_t^T a)        V_t in R^{d_t x d_emb}, W_up: d_emb -> d_up
    out = x + W_mix [x̂; h]              W_mix: d_in + d_up -> d_model

Table layout (CSR): rows of token t are keys[offsets[t] : offsets[t] + lengths[t]],
R = offsets[V] = the budget. `l3_lookup` is padded + masked: every token
gathers max_len rows (index offsets[t] + j, j < max_len) and masks j >= d_t out
of the softmax; max_len = min(cap, R - V + 1), the most any allocation can give
one id, so the compiled program depends on the config, not on the allocation.
Masked slots re-read the token's own first rows, so rows of token ids absent
from a batch are never touched and get exactly zero gradient. The layout
(offsets, lengths) is non-trained state (`LookupTable`), so checkpoints carry
it with the parameters.

Allocation of d_t (`allocate_rows`): every id gets one row (the embedding-table
case), the other R - V rows are split in proportion to a per-id weight, water-
filled at the cap (mass above the cap goes to the others) and rounded by
largest remainder so the total is exactly R. The weights are data
(moejax/data/l3_allocation.py: LZW phrase counts, frequencies or uniform); the
rows reach the layer from there, so building a model reads no corpus.
Read from the paper (via summaries of the arXiv text): the equation above,
static token routing, CPU offload/prefetch, LZW-based allocation and the 512
cap. Guessed: the exact LZW weight, the pre-norm x̂ on the query and in the mix,
the initialisation, and where L3 layers sit (here: after chosen decoder blocks,
each with its own residual, inside the block: moejax/models/block.py).

Sharding and host offload: the tables carry the logical axis "lookup_rows",
which moejax/sharding.RULES maps to no mesh axis (replicated; never split on
"embed" with the dense FSDP params). Because routing depends only on the token
ids, the rows a batch needs are known before the model runs; an offloaded
version would keep keys/values in host memory (a NamedSharding with
memory_kind="pinned_host"), gather the rows of the batch's ids on the host
(np.take over offsets/lengths, padded to max_len) and `jax.device_put` them to
device memory while earlier layers compute, then call `l3_lookup` on the
gathered block. Not implemented here: the tables live on device. Note that
AdamW's weight decay still shrinks absent rows; a sparse optimizer would not.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.layers.dense import RMSNorm, dense_init

PARAM_NAMES = ("keys", "values", "w_up", "ln_scale", "ln_bias", "w_mix")


def check_budget(vocab_size: int, budget: int, cap: int, key: str = "model.l3") -> None:
  """ConfigError unless one row per id fits and the cap can hold the budget."""
  if cap < 1:
    raise ConfigError(f"{key}.cap={cap} must be >= 1")
  if budget < vocab_size:
    raise ConfigError(
      f"{key}.budget={budget} is smaller than model.vocab_size={vocab_size}: "
      "every token id needs at least one row"
    )
  if cap * vocab_size < budget:
    raise ConfigError(
      f"{key}.budget={budget} cannot be allocated: {key}.cap={cap} x "
      f"model.vocab_size={vocab_size} = {cap * vocab_size} rows at most"
    )


def allocate_rows(weights, budget: int, cap: int) -> np.ndarray:
  """Rows per token id: >= 1 each, <= cap, summing to `budget`, the spare
  budget - V split in proportion to `weights` (see module doc)."""
  w = np.asarray(weights, np.float64)
  num = w.size
  check_budget(num, budget, cap)
  if not (np.all(np.isfinite(w)) and np.all(w >= 0)):
    raise ConfigError("L3 allocation weights must be finite and >= 0")
  target = np.ones(num)
  spare, free = float(budget - num), np.full(num, cap > 1)
  while spare > 0 and free.any():  # water-filling: saturate at cap, re-share the rest
    wf = np.where(free, w, 0.0)
    if wf.sum() <= 0:
      wf = free.astype(np.float64)  # only weightless ids have room: share evenly
    share = spare * wf / wf.sum()
    over = free & (share >= cap - target)
    if not over.any():
      target += share
      break
    spare -= float(np.sum(cap - target[over]))
    target[over], free = cap, free & ~over
  rows = np.minimum(np.floor(target + 1e-9), cap).astype(np.int64)
  deficit = budget - int(rows.sum())  # largest remainder; ties go to the lower id
  order = np.argsort(-(target - rows), kind="stable")
  order = order[rows[order] < cap][:deficit]
  rows[order] += 1
  assert rows.sum() == budget and rows.min() >= 1 and rows.max() <= cap, rows
  return rows


def csr_layout(rows) -> tuple[np.ndarray, np.ndarray]:
  """(offsets [V+1], lengths [V]) int32 from rows per id."""
  lengths = np.asarray(rows, np.int32)
  return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32), lengths


def l3_lookup(params, offsets, lengths, token_ids, x, *, max_len: int | None = None):
  """V_t^T softmax(K_t x) per token, padded to max_len rows and masked.

  params: {'keys': [R, d_in], 'values': [R, d_emb]}; offsets [V+1], lengths [V]
  int; token_ids [...] int; x [..., d_in]. Returns [..., d_emb] in x's dtype
  (softmax in at least float32). max_len must be static (default: max(lengths), which
  needs concrete lengths).
  """
  if max_len is None:
    max_len = int(np.max(np.asarray(lengths)))
  start, length = offsets[token_ids], lengths[token_ids]
  j = jnp.arange(max_len)
  mask = j < length[..., None]
  idx = start[..., None] + jnp.minimum(j, length[..., None] - 1)  # padding: own rows
  keys = params["keys"].astype(x.dtype)[idx]  # [..., M, d_in]
  values = params["values"].astype(x.dtype)[idx]  # [..., M, d_emb]
  logits = jnp.einsum("...d,...md->...m", x, keys)
  logits = logits.astype(jnp.promote_types(x.dtype, jnp.float32))
  probs = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
  probs = jnp.where(mask, probs, 0.0).astype(x.dtype)
  return jnp.einsum("...m,...me->...e", probs, values)


def l3_mix(params, x_hat, pooled, eps: float = 1e-5):
  """W_mix [x̂; LayerNorm(W_up pooled)] (the residual is added by the caller)."""
  dtype = x_hat.dtype
  h = (pooled @ params["w_up"].astype(dtype)).astype(jnp.promote_types(dtype, jnp.float32))
  mean = jnp.mean(h, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
  h = (h - mean) * jax.lax.rsqrt(var + eps) * params["ln_scale"] + params["ln_bias"]
  return jnp.concatenate([x_hat, h.astype(dtype)], axis=-1) @ params["w_mix"].astype(dtype)


class LookupTable(nnx.Variable):
  """Non-trained L3 table layout (CSR offsets and lengths), checkpointed."""


class LookupLayer(nnx.Module):
  """One L3 layer: x + W_mix [x̂; LN(W_up V_t^T softmax(K_t x̂))], x̂ = RMSNorm(x)."""

  def __init__(self, d_model: int, cfg, rows, *, rngs: nnx.Rngs, dtype, norm_eps=1e-6):
    offsets, lengths = csr_layout(rows)
    budget = int(offsets[-1])
    self.max_len = min(int(cfg.cap), budget - len(lengths) + 1)
    assert lengths.max() <= self.max_len, (lengths.max(), self.max_len)
    self.dtype = dtype
    self.offsets, self.lengths = (
      LookupTable(jnp.asarray(offsets)),
      LookupTable(jnp.asarray(lengths)),
    )
    self.norm = RMSNorm(d_model, norm_eps)
    rows_axes = ("lookup_rows", None)
    self.keys = nnx.Param(
      jax.random.normal(rngs.params(), (budget, d_model)) * d_model**-0.5, logical_axes=rows_axes
    )
    self.values = nnx.Param(
      jax.random.normal(rngs.params(), (budget, cfg.d_emb)), logical_axes=rows_axes
    )
    self.w_up = nnx.Param(
      dense_init()(rngs.params(), (cfg.d_emb, cfg.d_up)), logical_axes=(None, "embed")
    )
    self.ln_scale = nnx.Param(jnp.ones((cfg.d_up,), jnp.float32))
    self.ln_bias = nnx.Param(jnp.zeros((cfg.d_up,), jnp.float32))
    self.w_mix = nnx.Param(
      dense_init()(rngs.params(), (d_model + cfg.d_up, d_model)), logical_axes=(None, "embed")
    )

  def __call__(self, x, token_ids):
    params = {name: getattr(self, name)[...] for name in PARAM_NAMES}
    x_hat = self.norm(x).astype(self.dtype)
    pooled = l3_lookup(
      params, self.offsets[...], self.lengths[...], token_ids, x_hat, max_len=self.max_len
    )
    return x + l3_mix(params, x_hat, pooled).astype(x.dtype)


def validate_l3(c) -> None:
  """ConfigError for a bad `model.l3` section (called by validate_config)."""
  m, l3 = c.model, c.model.l3
  if not l3.enabled:
    return
  check_budget(m.vocab_size, l3.budget, l3.cap)
  for key in ("d_emb", "d_up"):
    if l3[key] < 1:
      raise ConfigError(f"model.l3.{key}={l3[key]} must be > 0")
  layers = tuple(l3.layers)
  if (
    not layers
    or len(set(layers)) != len(layers)
    or not all(isinstance(i, int) and 0 <= i < m.num_layers for i in layers)
  ):
    raise ConfigError(
      f"model.l3.layers={layers} must be distinct block indices in "
      f"[0, model.num_layers={m.num_layers})"
    )
