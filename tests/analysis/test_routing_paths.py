"""The recursive decomposition of router logits (moejax/analysis/routing_paths.py):
its sources sum to the router's own logits, it reduces to the direct decomposition
when attention moves nothing, and one block's split of a head's output over the
sources equals a loop over heads and positions in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.analysis import routing_attribution as ra
from moejax.analysis import routing_paths as rp
from moejax.models.capture import captured_forward

from tests.analysis.attribution_model import TOKENS, model


@pytest.fixture(scope="module")
def tiny():
  """Three blocks (dense, MoE, MoE with a gated shared expert), q/k/v and output biases."""
  return model()


def test_sources_sum_to_the_router_logits(tiny):
  layers = rp.recursive_attribute(*tiny, TOKENS)
  assert [layer["block"] for layer in layers] == [1, 2]
  for layer in layers:
    total = layer["contributions"].sum(axis=0)
    scale = np.abs(layer["logits"]).max()
    np.testing.assert_allclose(total, layer["logits"], atol=2e-5 * scale, rtol=0)
    assert not any(".head" in name for name in layer["names"])  # heads are paths, not sources
  names = layers[-1]["names"]
  assert names[:3] == ["embed", "attn0.v_bias", "attn0.bias"]
  assert "ffn0" in names and "moe1.shared" in names and "moe1.expert0" in names


def test_without_values_attention_moves_nothing_and_the_direct_split_is_recovered(tiny):
  """W_v = 0 and no value bias: every head writes 0, so each source's recursive
  contribution is its direct one, and the heads' direct contributions are 0."""
  graphdef, params, rest = tiny
  params = jax.tree.map(lambda v: v, params)
  for i in range(3):
    attn = params["blocks"][i]["attn"]
    attn["v"]["kernel"] = jnp.zeros_like(attn["v"]["kernel"])
    attn["v"]["bias"] = jnp.zeros_like(attn["v"]["bias"])
  recursive = rp.recursive_attribute(graphdef, params, rest, TOKENS)
  direct = ra.attribute(graphdef, params, rest, TOKENS)
  for r, d in zip(recursive, direct):
    for name, contribution in zip(d["names"], d["contributions"]):
      if ".head" in name:
        np.testing.assert_array_equal(contribution, 0.0)
      else:
        np.testing.assert_allclose(
          r["contributions"][r["names"].index(name)], contribution, atol=1e-6, rtol=1e-6
        )


def test_one_blocks_split_of_the_heads_equals_a_numpy_loop(tiny):
  """Block 1's heads on two parts of the stream (embedding, the rest), against
  out[t] = sum_h sum_s P[h, t, s] ((part_s * r_s * g) W_v[kv(h)]) W_o[h] by loops."""
  graphdef, params, rest = tiny
  m = nnx.merge(graphdef, params, rest)
  b, length = TOKENS.shape
  outputs = jax.jit(lambda p: captured_forward(nnx.merge(graphdef, p, rest), TOKENS)[2])(params)
  block = m.blocks[1]
  attn = block.attn
  stream_in = np.asarray(outputs[("blocks", 0, "__call__")][0], np.float64).reshape(b * length, -1)
  embed = np.asarray(m.embed[...], np.float64)[TOKENS].reshape(b * length, -1)
  parts = np.stack([embed, stream_in - embed])
  got = np.asarray(
    rp._moved_by_heads(
      block,
      outputs[("blocks", 1, "attn", "probabilities")],
      jnp.asarray(parts, jnp.float32),
      b,
      length,
    )
  )
  probs = np.asarray(outputs[("blocks", 1, "attn", "probabilities")], np.float64)  # B,G,R,L,S
  g_heads, r_heads = probs.shape[1], probs.shape[2]
  r = 1.0 / np.sqrt(np.mean(stream_in**2, axis=-1, keepdims=True) + block.attn_norm.eps)
  w_v = np.asarray(attn.v.kernel[...], np.float64).reshape(-1, g_heads, attn.head_dim)
  w_o = np.asarray(attn.o.kernel[...], np.float64).reshape(g_heads * r_heads, attn.head_dim, -1)
  scale = np.asarray(block.attn_norm.scale[...], np.float64)
  want = np.zeros_like(parts)
  for c in range(2):
    normed = parts[c] * r * scale
    for batch in range(b):
      for g in range(g_heads):
        for rep in range(r_heads):
          head = g * r_heads + rep
          values = normed[batch * length : (batch + 1) * length] @ w_v[:, g]  # [S, V]
          for t in range(length):
            ctx = sum(probs[batch, g, rep, t, s] * values[s] for s in range(length))
            want[c, batch * length + t] += ctx @ w_o[head]
  np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0)
