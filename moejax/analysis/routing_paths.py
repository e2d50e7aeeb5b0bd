"""The recursive decomposition of router logits: every attention head's output split
further into the sources whose values it moved (cross-layer routing contributions,
ICLR 2026 list, OpenReview BqyPLOkxFY; the paper's text was not read).

The direct decomposition (routing_attribution.attribute) splits the stream a router
reads into the components that wrote it, attention heads among them. A head writes
    head_{i,h}(x)_t = sum_s P_{i,h}[t, s] ((x_s * r_s * g_i) W_v[h]) W_o[h]
with its attention probabilities P and the RMSNorm factor r_s = rsqrt(mean(x_s^2) + eps)
of block i's attention input fixed at their forward-pass values: linear in the stream
x = sum_c S_c. Applying that map to each part S_c of the stream, block after block,
assigns every head's output to the sources it moved, recursively through every earlier
head. What is left are the sources that create new vectors:
    embed, attn{i}.bias (the output bias), attn{i}.v_bias (the value bias: the
    probabilities sum to 1, so it writes (b_v W_o) at every token), and the FFN
    writers moe{i}.expert{e}, moe{i}.shared and ffn{i},
and the router logits of MoE block l are exactly the sum over them of
(S_c^{(l)} * r * g) W_router, the normaliser frozen as in the direct decomposition.
The FFNs are not recursed into (their experts are nonlinear): an expert's
contribution is what it wrote, moved by the attention after it.

Guess: recursing through attention only (the paper's recursion is described only as
"applied recursively"). Same scope as the direct decomposition (its check_supported).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.analysis.routing_attribution import check_supported, component_names, layer_report
from moejax.errors import ConfigError
from moejax.layers.attention import attend
from moejax.models.capture import captured_forward
from moejax.posttrain.contributions import routed_contributions


def _moved_by_heads(block, probs, stream_CxTxD, b: int, length: int) -> jax.Array:
  """[C, T, d]: block's attention output (biases excluded) on each part of the stream,
  with its probabilities and RMSNorm factor taken from the whole stream."""
  attn, norm = block.attn, block.attn_norm
  x = jnp.sum(stream_CxTxD, axis=0)
  r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + norm.eps)
  normed = stream_CxTxD * r * norm.scale[...].astype(jnp.float32)
  v = normed @ attn.v.kernel[...].astype(jnp.float32)  # [C, T, G*V]
  v = v.reshape(v.shape[0], b, length, attn.num_kv_heads, -1)
  ctx = jax.vmap(lambda v_c: attend(probs, v_c))(v)  # [C, B, L, H, V]
  out = ctx.reshape(v.shape[0], b * length, -1) @ attn.o.kernel[...].astype(jnp.float32)
  return out


def _bias_sources(block, i: int, tokens_count: int, d: int) -> list[tuple[str, jax.Array]]:
  """The attention biases of block i as sources: (name, [T, d])."""
  attn, out = block.attn, []
  if attn.v.bias is not None:
    heads = attn.num_heads
    v_bias = attn.v.bias[...].astype(jnp.float32).reshape(attn.num_kv_heads, 1, -1)
    per_head = jnp.broadcast_to(
      v_bias, (attn.num_kv_heads, heads // attn.num_kv_heads, v_bias.shape[-1])
    )
    written = per_head.reshape(-1) @ attn.o.kernel[...].astype(jnp.float32)
    out.append((f"attn{i}.v_bias", jnp.broadcast_to(written, (tokens_count, d))))
  if attn.o.bias is not None:
    out.append(
      (f"attn{i}.bias", jnp.broadcast_to(attn.o.bias[...].astype(jnp.float32), (tokens_count, d)))
    )
  return out


def _ffn_sources(block, i: int, outputs, aux, x_ffn) -> list[tuple[str, jax.Array]]:
  """What block i's FFN wrote, split into its writers: (name, [T, d])."""
  t, d = x_ffn.shape
  if not block.is_moe:
    return [
      (f"ffn{i}", outputs[("blocks", i, "ffn", "__call__")].reshape(t, d).astype(jnp.float32))
    ]
  layer = block.ffn
  experts = jnp.moveaxis(routed_contributions(layer, x_ffn, aux), 1, 0)
  out = [(f"moe{i}.expert{e}", experts[e]) for e in range(experts.shape[0])]
  if layer.shared is not None:
    shared = layer.shared(x_ffn).astype(jnp.float32)
    if layer.shared_gate is not None:
      shared = shared * jax.nn.sigmoid(
        x_ffn.astype(jnp.float32) @ layer.shared_gate[...].astype(jnp.float32)
      )
    out.append((f"moe{i}.shared", shared))
  return out


def _decompose(model, tokens):
  """(source names, [{contributions [C_l, T, E], logits [T, E]}] per MoE block in
  order); that block's router reads the first C_l sources."""
  _, aux, outputs = captured_forward(model, tokens)
  b, length = tokens.shape
  d = model.cfg.d_model
  names = ["embed"]
  stream = model.embed[...].astype(jnp.float32)[tokens].reshape(1, b * length, d)
  moe_aux, layers = iter(aux["moe"]), []
  for i, block in enumerate(model.blocks):
    probs = outputs[("blocks", i, "attn", "probabilities")]
    stream = stream + _moved_by_heads(block, probs, stream, b, length)
    for name, written in _bias_sources(block, i, b * length, d):
      names.append(name)
      stream = jnp.concatenate([stream, written[None]])
    x_ffn = outputs[("blocks", i, "ffn_norm", "__call__")].reshape(b * length, d)
    if block.is_moe:
      x = jnp.sum(stream, axis=0)
      r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + block.ffn_norm.eps)
      w = block.ffn.router_kernel[...].astype(jnp.float32)
      layers.append(
        {
          "contributions": jnp.einsum("ctd,d,de->cte", stream * r, block.ffn_norm.scale[...], w),
          "logits": block.ffn.router_logits(x_ffn.astype(jnp.float32)),
        }
      )
    written = _ffn_sources(block, i, outputs, next(moe_aux) if block.is_moe else None, x_ffn)
    names += [name for name, _ in written]
    stream = jnp.concatenate([stream, jnp.stack([w for _, w in written])])
  return names, layers


@functools.partial(jax.jit, static_argnums=0)
def _recursive(graphdef, params, rest, tokens):
  return _decompose(nnx.merge(graphdef, params, rest), tokens)[1]


def recursive_attribute(graphdef, params, rest, tokens) -> list[dict]:
  """Per MoE block (in order): block index, source names, contributions [C, T, E]
  (float32) of each source through every attention path (module doc), the router's
  own logits [T, E], top_k and the influence Var_t summed over experts [C]."""
  model = nnx.merge(graphdef, params, rest)
  check_supported(model)
  for i, block in enumerate(model.blocks):
    adapted = getattr(block.attn, "adapter", None) is not None  # e.g. LoRA-Mixer projections
    if adapted or type(block.attn.v).__name__ != "Linear":
      raise ConfigError(f"block {i}: the recursive decomposition needs a plain value projection")
  names = component_names(model, recursive=True)
  moe_blocks = [i for i, block in enumerate(model.blocks) if block.is_moe]
  out = []
  for block, layer in zip(moe_blocks, _recursive(graphdef, params, rest, jnp.asarray(tokens))):
    contributions = np.asarray(layer["contributions"])
    out.append(layer_report(model, block, names, contributions, layer["logits"]))
  return out
