"""KV-cache decoding equals the full forward pass at every position (1e-5) for
every family, MLA included, and for the trained default, OmniMoE and L3 models,
on a left-padded batch; batched generation equals
generating each prompt alone; chunked decode calls draw what single steps draw;
top-k / top-p filtering; decode routing metrics."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.configs import lm_shakespeare_l3, lm_shakespeare_omnimoe
from moejax.configs.lm_shakespeare_moe import get_config
from moejax.data import l3_allocation
from moejax.layers.lookup import allocate_rows
from moejax.models.structure import moe_layer_indices
from moejax.inference import generate as gen_lib
from moejax.inference.generate import filter_logits, generate, left_pad, sample_tokens
from moejax.inference.kv_cache import cache_bytes, init_cache
from moejax.interop.hf_config import from_hf_config
from moejax.models import Decoder
from moejax.models.decoder import abstract_model
from tests.interop.hf_tiny import FAMILY_NAMES, family_configs

pytestmark = pytest.mark.slow  # runs first (tests/conftest.py)


def with_experts(kind: str, **settings):
  """The default LM's config getter with model.moe.experts = kind (and its settings)."""

  def config(arg):
    c = get_config(arg)
    c.model.moe.experts = kind
    c.model.moe[kind].update(settings)
    return c

  return config


# moejax's own models at size=tiny: the default LM, OmniMoE, L3, and the default LM
# with each compressed expert type (issue 15).
TRAINED = {
  "moejax": get_config,
  "omnimoe": lm_shakespeare_omnimoe.get_config,
  "l3": lm_shakespeare_l3.get_config,
  "quantized": with_experts("quantized", group_size=16),
  "codebook": with_experts("codebook", group_size=16, rotation="hadamard"),
  "factorised": with_experts(
    "factorised", ranks_gate=(4, 16, 16), ranks_up=(4, 16, 16), ranks_down=(4, 16, 16)
  ),
}


def family_config(name):
  if name in TRAINED:
    m = TRAINED[name]("size=tiny").model
  else:
    m = from_hf_config(family_configs()[name].to_dict())
  m.moe.grouped_matmul = "tiled"  # fastest to compile on CPU
  return m


def random_params(m, seed=0):
  """Params with decisive routing (router ~N(0, 1)) and non-trivial norms and biases."""
  _, params, rest = abstract_model(m)
  leaves, treedef = jax.tree_util.tree_flatten_with_path((params, rest))
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  out, real = [], []  # real: the model's real init, built once if a leaf needs it
  for (path, spec), key in zip(leaves, keys):
    name = jax.tree_util.keystr(path)
    if not jnp.issubdtype(spec.dtype, jnp.floating):  # L3's table layout: a real init
      real = real or [real_init(m)]
      out.append(leaf_at(real[0], path))
      continue
    noise = jax.random.normal(key, spec.shape, jnp.float32)
    if "scale" in name or "var_" in name:  # norm scales, OmniMoE's BatchNorm variances
      value = 1.0 + 0.2 * jnp.abs(noise)
    elif "router_kernel" in name:
      value = noise
    elif "bias" in name:
      value = 0.1 * noise
    else:
      value = noise * spec.shape[-2 if len(spec.shape) > 1 else 0] ** -0.5
    out.append(value.astype(spec.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def real_init(m):
  """(params, rest) pure dicts of the model's own initialisation (L3 rows allocated by
  the config's rule over its corpus: unequal rows per id)."""
  rows = None
  if m.l3.enabled:
    weights = l3_allocation.token_weights(m.l3.allocation, m.l3.corpus, m.vocab_size)
    rows = allocate_rows(weights, m.l3.budget, m.l3.cap)
  m = ml_collections.FrozenConfigDict(m)
  model = nnx.merge(*nnx.split(Decoder(m, rngs=nnx.Rngs(0), l3_rows=rows)))
  _, params, rest = nnx.split(model, nnx.Param, ...)
  return nnx.to_pure_dict(params), nnx.to_pure_dict(rest)


def leaf_at(tree, path):
  for key in path:
    tree = tree[key.idx if hasattr(key, "idx") else key.key]
  return tree


def batch(vocab):
  rng = np.random.default_rng(1)
  prompts = [list(rng.integers(3, vocab, 9)), list(rng.integers(3, vocab, 5))]
  return left_pad(prompts)


@pytest.mark.parametrize("name", FAMILY_NAMES + tuple(TRAINED))
def test_decode_equals_full_forward_at_every_position(name):
  """One pass over the whole left-padded batch vs one token at a time from an
  empty cache (padding included), each with its own cache."""
  m = family_config(name)
  params, rest = random_params(m)
  graphdef, _, _ = abstract_model(m)
  run = jax.jit(
    lambda t, mask, cache: nnx.merge(graphdef, params, rest)(t, token_mask_BxL=mask, cache=cache)
  )
  tokens, mask = batch(m.vocab_size)
  full, _, _ = run(tokens, mask, init_cache(m, 2, tokens.shape[1] + 2))
  cache, steps = init_cache(m, 2, tokens.shape[1] + 2), []
  for i in range(tokens.shape[1]):
    logits, aux, cache = run(tokens[:, i : i + 1], mask[:, i : i + 1], cache)
    steps.append(logits)
  decoded = np.concatenate(steps, axis=1)
  largest = np.abs(np.asarray(full)[mask]).max()
  assert largest > 0.5
  # 1e-5 of the largest logit: the two paths sum attention and experts in other
  # orders, and float32 rounding grows with the logits (qwen3_moe reached 2.2e-5
  # absolute at |logits| ~ 3 on an AMD EPYC host, 9e-6 relative).
  np.testing.assert_allclose(decoded[mask], np.asarray(full)[mask], atol=1e-5 * largest, rtol=0)
  for layer in aux["moe"]:  # the last step's metric: experts the 2 rows used
    assert int(layer["metrics"]["distinct_experts"]) == len(np.unique(layer["expert_index"]))


def test_full_forward_with_and_without_a_cache_agree():
  m = family_config("deepseek_v3")
  params, rest = random_params(m)
  model = nnx.merge(abstract_model(m)[0], params, rest)
  tokens, mask = batch(m.vocab_size)
  without, _, _ = jax.jit(lambda t, k: model(t, token_mask_BxL=k))(tokens, mask)
  with_cache, _, _ = jax.jit(lambda t, k, c: model(t, token_mask_BxL=k, cache=c))(
    tokens, mask, init_cache(m, 2, 9)
  )
  # with a cache MLA attends in the absorbed form (another summation order)
  largest = np.abs(np.asarray(without)[mask]).max()
  np.testing.assert_allclose(
    np.asarray(with_cache)[mask], np.asarray(without)[mask], atol=1e-5 * largest, rtol=0
  )


@pytest.mark.parametrize("matmul", ["auto", "tiled"])  # auto: 'gather' at batch 1 (k <= E)
def test_chunked_sampling_equals_one_step_per_call(monkeypatch, matmul):
  """Decode steps fused DECODE_CHUNK to a compiled call draw exactly what one step
  per call draws (temperature 0.9, the same fold_in key per position)."""
  m = family_config("qwen3_moe")
  m.moe.grouped_matmul = matmul
  params, rest = random_params(m, seed=6)
  new_tokens = 2 * gen_lib.DECODE_CHUNK + 3

  def run():
    return generate(
      m, params, rest, [[5, 9, 14], [3]], max_new_tokens=new_tokens, temperature=0.9, seed=11
    )

  chunked = run()
  monkeypatch.setattr(gen_lib, "DECODE_CHUNK", 10**6)
  stepwise = run()
  np.testing.assert_array_equal(chunked.tokens, stepwise.tokens)
  np.testing.assert_array_equal(chunked.distinct_experts, stepwise.distinct_experts)
  assert len(set(chunked.tokens[0].tolist())) > 3  # sampled, not a constant


def test_mla_caches_only_the_latent():
  m = family_config("deepseek_v3")
  cache = init_cache(m, 2, 12)
  assert set(cache.layers[0]) == {"latent", "k_rope"}
  assert cache.layers[0]["latent"].shape == (2, 12, m.attention.mla.kv_lora_rank)
  per_token_heads = m.num_heads * (
    m.attention.mla.qk_nope_head_dim + m.attention.mla.qk_rope_head_dim + m.attention.mla.v_head_dim
  )
  assert cache_bytes(m, 2, 12) < 2 * 12 * per_token_heads * 4 * m.num_layers


def test_batched_greedy_generation_equals_each_prompt_alone():
  """The short prompt, left padded beside a long one, continues as it does alone."""
  m = family_config("qwen3_moe")
  params, rest = random_params(m, seed=3)
  prompts = [[5, 9, 14, 3, 60, 7], [11, 4]]
  together = generate(m, params, rest, prompts, max_new_tokens=6)
  alone = generate(m, params, rest, [prompts[1]], max_new_tokens=6)
  np.testing.assert_array_equal(together.tokens[1], alone.tokens[0])
  assert together.distinct_experts.shape == (5, len(moe_layer_indices(m)))
  assert (together.distinct_experts >= 1).all()
  assert (together.distinct_experts <= 2 * m.moe.top_k).all()  # 2 rows x top_k each


def test_top_k_and_top_p_filtering():
  logits = jnp.log(jnp.array([0.5, 0.05, 0.3, 0.15]))

  def kept(**kw):
    return set(np.flatnonzero(np.isfinite(np.asarray(filter_logits(logits, **kw)))))

  assert kept(top_k=2, top_p=1.0) == {0, 2}
  assert kept(top_k=0, top_p=0.5) == {0}  # 0.5 alone reaches the mass
  assert kept(top_k=0, top_p=0.7) == {0, 2}
  assert kept(top_k=0, top_p=0.9) == {0, 2, 3}
  draws = {int(sample_tokens(logits, jax.random.key(i), 1.0, 0, 0.7)) for i in range(100)}
  assert draws == {0, 2}
  assert int(sample_tokens(logits, jax.random.key(0), 0.0)) == 0


def test_generation_compiles_nothing_per_step_or_per_length_within_a_bucket():
  """After one warm-up call, a 200-token generation with another prompt length in
  the same bucket (and another number of new tokens in the same cache bucket)
  compiles nothing: the step is one program for every position."""
  import jax.monitoring

  m = family_config("moejax")
  m.max_seq_len = 512
  params, rest = random_params(m, seed=4)
  compiles = []

  def listener(name, secs, **kw):
    return compiles.append(name) if name.endswith("backend_compile_duration") else None

  generate(m, params, rest, [[5, 9, 14]], max_new_tokens=190)  # bucket 8, 256 slots
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    out = generate(m, params, rest, [[7, 3, 11, 2, 60, 33]], max_new_tokens=200)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert out.tokens.shape == (1, 200)
  assert compiles == []


def test_bucketed_greedy_generation_follows_the_unpadded_full_forward():
  """Prompt padding to its bucket changes nothing: each greedy token is the argmax
  of the full forward pass over the unpadded prompt and the tokens so far (read,
  the model being causal, from one forward pass over the whole unpadded sequence)."""
  m = family_config("qwen3_moe")
  params, rest = random_params(m, seed=5)
  prompt = [5, 9, 14, 3, 60]  # padded to 8 inside generate
  # 12 new tokens: one compiled chunk of DECODE_CHUNK steps, then single steps
  out = [int(t) for t in generate(m, params, rest, [prompt], max_new_tokens=12).tokens[0]]
  graphdef = abstract_model(m)[0]
  logits = jax.jit(lambda t: nnx.merge(graphdef, params, rest)(t)[0])(
    jnp.asarray([prompt + out], jnp.int32)
  )
  assert [int(t) for t in jnp.argmax(logits[0, len(prompt) - 1 : -1], axis=-1)] == out
