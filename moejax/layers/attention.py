"""The one attention module of every model, with an optional KV cache.

GroupedQueryAttention: moejax's own LM, Mixtral, Qwen2/3-MoE, OLMoE
(GQA, Ainslie et al. 2023), with the family flags of moejax/config.py: q/k/v biases,
q/k RMSNorm per head (Qwen3) or across heads (OLMoE), q/k/v clipping (OLMoE),
sliding windows (Mistral).
LatentAttention: multi-head latent attention (DeepSeek-V2, sec. 2.1; V3).
Keys and values come from a low-rank latent c = norm(x W_dkv) [kv_lora_rank]
plus one shared RoPE key [qk_rope_head_dim]; the cache holds only these two.
Without a cache (training) they are expanded with kv_b_proj into per-head keys
and values. With one (generation) the default is the absorbed form
(DeepSeek-V2, sec. 2.1.2): kv_b's key half is folded into the queries,
q_nope W_UK^T, which then score the cached latent directly, and its value half
is applied after the weighted sum of latents, so the cache is never
re-expanded. The two forms are equal up to float rounding
(tests/layers/test_mla_absorbed.py); `absorb=` chooses one.

Both return (out, new layer cache). Without a cache the keys are the call's
own tokens; with one, the new keys are written at slot `start` and the
queries attend over the whole cache. `allowed` [B, Lq, S] says which key
slots each query may see (causal, padding, window); see moejax/models/decoder.py.
Non-causal (the ViT, moejax/models/vit.py): every slot allowed, and positions
None, which turns the rotary embedding off (the ViT adds learned position
embeddings to its patches instead). GroupedQueryAttention takes an optional
key/value prefix hook (prefixed_attention: prefix tuning, SMoPE's prompt experts).
Every projection carries logical axes (moejax/sharding.py): heads split over
`tensor`, the model dimension over `fsdp`; MLA's low-rank latents stay whole.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax.adapters.projection import Projector, build_projection_adapters
from moejax.layers.dense import Linear, RMSNorm
from moejax.layers.rope import apply_rope, attention_scale, rope_frequencies


def projection(rngs, dtype):
  """Linear(d_in, d_out, axes, bias) with the module's rngs and compute dtype."""
  return lambda d_in, d_out, axes, bias=False: Linear(
    d_in, d_out, rngs=rngs, dtype=dtype, logical_axes=axes, bias=bias
  )


def attention_scores(q_BxLxHxK, k_BxSxGxK, allowed_BxLxS, scale: float):
  """The scaled logits q.k * scale, float32 [B, G, R, L, S] for H = G * R query heads
  (head h = g * R + r reads key/value head g); disallowed slots at the float32 minimum."""
  b, length, h, _ = q_BxLxHxK.shape
  g = k_BxSxGxK.shape[2]
  q = q_BxLxHxK.reshape(b, length, g, h // g, -1)
  scores = jnp.einsum("blgrk,bsgk->bgrls", q, k_BxSxGxK).astype(jnp.float32) * scale
  return jnp.where(allowed_BxLxS[:, None, None], scores, jnp.finfo(jnp.float32).min)


def attention_probabilities(q_BxLxHxK, k_BxSxGxK, allowed_BxLxS, scale: float):
  """The softmax of every attention: float32 [B, G, R, L, S] over key slots S
  (attention_scores); disallowed slots get probability 0. Analysis reads it through
  the modules' `probabilities` (moejax/analysis/super_experts.py: attention sinks)."""
  return jax.nn.softmax(attention_scores(q_BxLxHxK, k_BxSxGxK, allowed_BxLxS, scale), axis=-1)


def attend(probs_BxGxRxLxS, v_BxSxGxV):
  """The values weighted by `attention_probabilities` -> [B, L, H, V]."""
  b, _, _, length, _ = probs_BxGxRxLxS.shape
  out = jnp.einsum("bgrls,bsgv->blgrv", probs_BxGxRxLxS.astype(v_BxSxGxV.dtype), v_BxSxGxV)
  return out.reshape(b, length, -1, v_BxSxGxV.shape[-1])


def prefixed_attention(q_BxLxHxK, k_BxSxGxK, v_BxSxGxV, allowed_BxLxS, scale: float, prefix):
  """Attention over P prefix slots and the S key slots in one softmax -> [B, L, H, V]
  (prefix tuning, Li and Liang 2021, sec. 4.2: keys [P_K; K], values [P_V; V]).

  prefix(q) -> (logits [B, H, L, P] before the scale, values [B, H, P, V]): the hook of
  a key/value prompt adapter (moejax/adapters/smope.py); dense prefix tuning gives
  logits q_l . p_j^K. Every prefix slot is allowed to every query."""
  b, length, h, _ = q_BxLxHxK.shape
  g = k_BxSxGxK.shape[2]
  prefix_logits, prefix_values = prefix(q_BxLxHxK)
  p = prefix_logits.shape[-1]
  extra = prefix_logits.astype(jnp.float32).reshape(b, g, h // g, length, p) * scale
  scores = attention_scores(q_BxLxHxK, k_BxSxGxK, allowed_BxLxS, scale)
  probs = jax.nn.softmax(jnp.concatenate([extra, scores], axis=-1), axis=-1)
  to_prefix = probs[..., :p].reshape(b, h, length, p).astype(prefix_values.dtype)
  out = jnp.einsum("bhlp,bhpv->blhv", to_prefix, prefix_values)
  return out.astype(v_BxSxGxV.dtype) + attend(probs[..., p:], v_BxSxGxV)


def probabilities(self, q_BxLxHxK, k_BxSxGxK, allowed_BxLxS):
  """Both attention modules' softmax, a method of each (nnx.capture's method_outputs
  records it, under .../attn/probabilities, with no model edits)."""
  return attention_probabilities(q_BxLxHxK, k_BxSxGxK, allowed_BxLxS, self.scale)


def rotary(rope_cfg, positions_BxL):
  """t [B, L, H, D] -> t rotated at `positions` (frequencies for D computed once per trace);
  t itself when positions_BxL is None (no rotary embedding: the non-causal ViT)."""
  if positions_BxL is None:
    return lambda t: t
  return lambda t: apply_rope(
    t, positions_BxL, *rope_frequencies(rope_cfg, t.shape[-1]), rope_cfg.interleave
  )


def write_cache(layer_cache: dict | None, new: dict, start) -> dict:
  """The cache with `new` [B, L, ...] written at slot `start`; `new` itself without a cache."""
  if layer_cache is None:
    return new
  return {
    name: jax.lax.dynamic_update_slice_in_dim(
      layer_cache[name], value.astype(layer_cache[name].dtype), start, axis=1
    )
    for name, value in new.items()
  }


class GroupedQueryAttention(nnx.Module):
  probabilities = probabilities

  def __init__(self, m, *, rngs: nnx.Rngs, dtype):
    a = m.attention
    self.num_heads, self.num_kv_heads, self.head_dim = m.num_heads, m.num_kv_heads, m.head_dim
    q_dim, kv_dim = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    proj = projection(rngs, dtype)
    shapes = {  # (d_in, d_out, logical axes) of each projection
      "q": (m.d_model, q_dim, ("embed", "heads")),
      "k": (m.d_model, kv_dim, ("embed", "kv_heads")),
      "v": (m.d_model, kv_dim, ("embed", "kv_heads")),
      "o": (q_dim, m.d_model, ("heads", "embed")),
    }
    self.q, self.k, self.v = (proj(*shapes[name], a.qkv_bias) for name in "qkv")
    self.o = proj(*shapes["o"], a.out_bias)
    # model.attention.adapter's term on the projections (moejax/adapters/projection.py)
    self.adapter = build_projection_adapters(m, shapes, rngs=rngs, dtype=dtype)
    self.qk_norm, self.clip = a.qk_norm, a.clip_qkv
    if a.qk_norm == "per_head":
      self.q_norm, self.k_norm = RMSNorm(m.head_dim, m.norm_eps), RMSNorm(m.head_dim, m.norm_eps)
    elif a.qk_norm == "across_heads":
      self.q_norm, self.k_norm = RMSNorm(q_dim, m.norm_eps), RMSNorm(kv_dim, m.norm_eps)
    self.rope_cfg, self.scale = m.rope, attention_scale(m.rope, m.head_dim)

  def __call__(
    self,
    x_BxLxD,
    positions_BxL,
    allowed_BxLxS,
    layer_cache=None,
    start=0,
    prefix=None,
    token_mask_BxL=None,
    with_aux=False,
  ):
    """prefix: None, or a key/value prefix hook (prefixed_attention).
    token_mask_BxL: the adapter's routing skips padding; with_aux: return (out, cache,
    the adapter's aux or None) (DecoderBlock)."""
    b, length, _ = x_BxLxD.shape
    project = Projector(self.adapter, token_mask_BxL)
    q, k, v = (project(name, getattr(self, name), x_BxLxD) for name in "qkv")
    if self.qk_norm == "across_heads":
      q, k = self.q_norm(q), self.k_norm(k)
    if self.clip:
      q, k, v = (jnp.clip(t, -self.clip, self.clip) for t in (q, k, v))
    q = q.reshape(b, length, self.num_heads, self.head_dim)
    k = k.reshape(b, length, self.num_kv_heads, self.head_dim)
    v = v.reshape(b, length, self.num_kv_heads, self.head_dim)
    if self.qk_norm == "per_head":
      q, k = self.q_norm(q), self.k_norm(k)
    rope = rotary(self.rope_cfg, positions_BxL)
    cache = write_cache(layer_cache, {"k": rope(k), "v": v}, start)
    if prefix is None:
      out = attend(self.probabilities(rope(q), cache["k"], allowed_BxLxS), cache["v"])
    else:
      out = prefixed_attention(rope(q), cache["k"], cache["v"], allowed_BxLxS, self.scale, prefix)
    out = project("o", self.o, out.reshape(b, length, -1))
    return (out, cache, project.aux()) if with_aux else (out, cache)


class LatentAttention(nnx.Module):
  probabilities = probabilities

  def __init__(self, m, *, rngs: nnx.Rngs, dtype):
    a, mla = m.attention, m.attention.mla
    self.num_heads = m.num_heads
    self.nope_dim, self.rope_dim, self.v_dim = (
      mla.qk_nope_head_dim,
      mla.qk_rope_head_dim,
      mla.v_head_dim,
    )
    self.latent_dim = mla.kv_lora_rank
    qk_dim = self.nope_dim + self.rope_dim
    proj = projection(rngs, dtype)
    if mla.q_lora_rank:
      self.q_a = proj(m.d_model, mla.q_lora_rank, ("embed", None), a.qkv_bias)
      self.q_a_norm = RMSNorm(mla.q_lora_rank, m.norm_eps)
      self.q_b = proj(mla.q_lora_rank, m.num_heads * qk_dim, (None, "heads"))
    else:
      self.q = proj(m.d_model, m.num_heads * qk_dim, ("embed", "heads"))
    self.kv_a = proj(m.d_model, self.latent_dim + self.rope_dim, ("embed", None), a.qkv_bias)
    self.kv_a_norm = RMSNorm(self.latent_dim, m.norm_eps)
    self.kv_b = proj(self.latent_dim, m.num_heads * (self.nope_dim + self.v_dim), (None, "heads"))
    self.o = proj(m.num_heads * self.v_dim, m.d_model, ("heads", "embed"), a.out_bias)
    self.has_q_lora = bool(mla.q_lora_rank)
    self.rope_cfg, self.scale = m.rope, attention_scale(m.rope, qk_dim)

  def __call__(
    self,
    x_BxLxD,
    positions_BxL,
    allowed_BxLxS,
    layer_cache=None,
    start=0,
    absorb: bool | None = None,
  ):
    """absorb: the absorbed form (module doc); default: exactly when there is a cache."""
    b, length, _ = x_BxLxD.shape
    q = self.q_b(self.q_a_norm(self.q_a(x_BxLxD))) if self.has_q_lora else self.q(x_BxLxD)
    q = q.reshape(b, length, self.num_heads, self.nope_dim + self.rope_dim)
    q_nope, q_rope = jnp.split(q, [self.nope_dim], axis=-1)
    latent, k_rope = jnp.split(self.kv_a(x_BxLxD), [self.latent_dim], axis=-1)
    rope = rotary(self.rope_cfg, positions_BxL)
    new = {"latent": self.kv_a_norm(latent), "k_rope": rope(k_rope[:, :, None])[:, :, 0]}
    cache = write_cache(layer_cache, new, start)
    if absorb is None:
      absorb = layer_cache is not None
    if absorb:
      return self._absorbed(q_nope, rope(q_rope), cache, allowed_BxLxS), cache
    s = cache["latent"].shape[1]
    kv = self.kv_b(cache["latent"]).reshape(b, s, self.num_heads, self.nope_dim + self.v_dim)
    k_nope, v = jnp.split(kv, [self.nope_dim], axis=-1)
    k_rope_shared = jnp.broadcast_to(
      cache["k_rope"][:, :, None], (b, s, self.num_heads, self.rope_dim)
    )
    k = jnp.concatenate([k_nope, k_rope_shared.astype(k_nope.dtype)], axis=-1)
    q = jnp.concatenate([q_nope, rope(q_rope)], axis=-1)
    out = attend(self.probabilities(q, k, allowed_BxLxS), v)
    return self.o(out.reshape(b, length, -1)), cache

  def _absorbed(self, q_nope, q_rope, cache, allowed_BxLxS):
    """Attention over the cached latent without expanding it: one key/value "head"
    [latent, k_rope] shared by all query heads, queries [q_nope W_UK^T, q_rope]."""
    b, length, h, _ = q_nope.shape
    kernel = (
      self.kv_b.kernel[...]
      .astype(self.kv_b.dtype)
      .reshape(self.latent_dim, h, self.nope_dim + self.v_dim)
    )
    w_uk, w_uv = kernel[..., : self.nope_dim], kernel[..., self.nope_dim :]
    q = jnp.concatenate(
      [jnp.einsum("blhn,chn->blhc", q_nope.astype(w_uk.dtype), w_uk), q_rope.astype(w_uk.dtype)],
      axis=-1,
    )
    k = jnp.concatenate([cache["latent"], cache["k_rope"].astype(cache["latent"].dtype)], axis=-1)[
      :, :, None
    ]
    out = attend(
      self.probabilities(q, k.astype(q.dtype), allowed_BxLxS),
      cache["latent"][:, :, None].astype(q.dtype),
    )  # [B, L, H, latent]
    out = jnp.einsum("blhc,chv->blhv", out, w_uv)
    return self.o(out.reshape(b, length, -1))
