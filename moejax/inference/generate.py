"""Batched generation with a KV cache for the decoder (moejax/models/decoder.py).

Prompts of different lengths are left padded into one [B, L] block, prefilled
in one call (the empty cache is made inside it), then decoded one token per row
per step; each step samples and feeds the next token, DECODE_CHUNK steps per
compiled call (the tail one per call). Shapes are bucketed so that neither the
step nor the length recompiles: L is padded to a power of two (at least 8) and
the cache to a multiple of 64 slots, so a model compiles one prefill per (batch,
bucket) and one chunk and one step per (batch, cache bucket). The compiled calls
close over the model's graphdef (DecodePrograms), built once per config.
Sampling per step: greedy (temperature 0), else softmax(logits / T)
restricted to the top_k logits and to the smallest set whose probability
reaches top_p (nucleus sampling, Holtzman et al. 2020).

Routing during decode: each step's MoE layers see B tokens, one per row;
`distinct_experts` [steps, moe_layers] counts the experts that step activated
in each layer (the number of expert weight sets a decode step must read:
the memory-bound cost of MoE decoding).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from moejax.errors import ConfigError
from moejax.inference.kv_cache import init_cache
from moejax.models.decoder import abstract_model


PROMPT_BUCKET_MIN, CACHE_MULTIPLE = 8, 64


def prompt_bucket(length: int) -> int:
  """The padded prompt length: the next power of two, at least PROMPT_BUCKET_MIN."""
  return max(PROMPT_BUCKET_MIN, 1 << (length - 1).bit_length())


def left_pad(
  prompts: list[list[int]], pad_id: int = 0, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """tokens int32 [B, L] and mask bool [B, L], each prompt right-aligned; L is the
  longest prompt, or `length` when given (at least that)."""
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ConfigError("every prompt needs at least one token")
  length = max(max(len(p) for p in prompts), length or 0)
  tokens = np.full((len(prompts), length), pad_id, np.int32)
  mask = np.zeros((len(prompts), length), bool)
  for row, prompt in enumerate(prompts):
    tokens[row, length - len(prompt) :] = prompt
    mask[row, length - len(prompt) :] = True
  return tokens, mask


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Logits with everything outside the top_k (0: all) and the top_p nucleus at -inf."""
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    # keep a token while the mass before it is below top_p (the first always stays)
    keep = (cumulative - jax.nn.softmax(sorted_logits, axis=-1)) < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def sample_tokens(logits, rng, temperature: float, top_k: int = 0, top_p: float = 1.0):
  """Next token per row: argmax when temperature == 0, else a filtered softmax draw."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  filtered = filter_logits(logits.astype(jnp.float32) / temperature, top_k, top_p)
  return jax.random.categorical(rng, filtered, axis=-1).astype(jnp.int32)


def generation_config(m):
  """m as decoding runs it: dropless dispatch with small tiles (a decode step sends
  a handful of rows to each expert; capacity drops would depend on the batch and
  make decoding non-causal). ConfigError for a router that is not causal, and for
  merged experts (moejax/experts/merged.py), whose gates come from the previous segment."""
  from moejax import routing

  if m.ffn_type == "moe" and not routing.get_router(m.moe.router).causal:
    raise ConfigError(
      f"model.moe.router={m.moe.router!r} is not causal: a decoder "
      "routes each token from its own state only"
    )
  if m.ffn_type == "moe" and m.moe.get("merge", "none") != "none":
    raise ConfigError(
      f"model.moe.merge={m.moe.merge!r}: merged experts route by the previous segment, "
      "which a KV-cache decode step of one token does not see; score with a full forward"
    )
  if m.get("scan_layers", False):
    raise ConfigError(
      "model.scan_layers=True: decode the loop layout "
      "(moejax.models.decoder.unstack_layers; moejax.train.load does it)"
    )
  m = ml_collections.ConfigDict(m.to_dict())
  m.remat = "none"  # no backward pass here
  m.moe.dispatch = "dropless"
  m.moe.dropless.tile = min(m.moe.dropless.tile, 8)
  return m


def validate_sampling(temperature: float, top_k: int, top_p: float, max_new_tokens: int) -> None:
  if temperature < 0:
    raise ConfigError(f"temperature={temperature} must be >= 0 (0 = greedy)")
  if top_k < 0:
    raise ConfigError(f"top_k={top_k} must be >= 0 (0 = all tokens)")
  if not 0 < top_p <= 1:
    raise ConfigError(f"top_p={top_p} must be in (0, 1]")
  if max_new_tokens < 1:
    raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 1")


@dataclasses.dataclass
class Generated:
  tokens: np.ndarray  # int32 [B, max_new_tokens]
  distinct_experts: np.ndarray  # int32 [decode steps, MoE layers]
  prefill_distinct_experts: np.ndarray  # int32 [MoE layers]

  def row(self, i: int, eos_id: int | None = None) -> list[int]:
    out = [int(t) for t in self.tokens[i]]
    return out[: out.index(eos_id) + 1] if eos_id is not None and eos_id in out else out


def _forward(graphdef, params, rest, tokens, mask, cache):
  logits, aux, cache = nnx.merge(graphdef, params, rest)(
    tokens, token_mask_BxL=mask, cache=cache, last_logits_only=True
  )
  distinct = jnp.stack(
    [a["metrics"]["distinct_experts"] for a in aux["moe"]] or [jnp.zeros((), jnp.int32)]
  )
  return logits[:, -1], distinct, cache


def sample_and_forward(graphdef, params, rest, logits, rng, cache, temperature, top_k, top_p):
  """(sampled token [B], next logits [B, V], distinct experts, cache): one decode step."""
  token = sample_tokens(logits, rng, temperature, top_k, top_p)
  ones = jnp.ones((token.shape[0], 1), bool)
  logits, distinct, cache = _forward(graphdef, params, rest, token[:, None], ones, cache)
  return token, logits, distinct, cache


def _sample_and_forward_steps(
  graphdef, params, rest, logits, rng, first, cache, steps, temperature, top_k, top_p
):
  def one(carry, i):
    logits, cache = carry
    token, logits, distinct, cache = sample_and_forward(
      graphdef, params, rest, logits, jax.random.fold_in(rng, i), cache, temperature, top_k, top_p
    )
    return (logits, cache), (token, distinct)

  (logits, cache), (tokens, distinct) = jax.lax.scan(
    one, (logits, cache), first + jnp.arange(steps, dtype=jnp.int32)
  )
  return tokens, logits, distinct, cache


def _prefill(m, graphdef, params, rest, tokens, mask, slots):
  return _forward(graphdef, params, rest, tokens, mask, init_cache(m, tokens.shape[0], slots))


# Decode steps per compiled call (DecodePrograms.steps): the host's per-call cost
# (~0.5-1 ms for a call with the model's ~70 arguments, docs/results/generate_cpu.md)
# is paid once per chunk; the last max_new_tokens % chunk steps run one by one.
DECODE_CHUNK = 8


@dataclasses.dataclass(frozen=True)
class DecodePrograms:
  """The compiled calls that decode one model config, each closing over its graphdef
  (as a static argument jax would hash it on every call: ~2.5 ms for a 4-layer model).

    forward(params, rest, tokens [B, L], mask, cache) -> (last logits [B, V],
        distinct experts per MoE layer, cache): feed tokens (teacher forcing).
    prefill(params, rest, tokens, mask, slots) -> the same, from an empty cache of
        `slots` slots made inside the call (slots static).
    step(params, rest, logits, rng, cache, temperature, top_k, top_p) -> (token [B],
        next logits, distinct experts, cache): sample and feed one token.
    steps(params, rest, logits, rng, first, cache, n, temperature, top_k, top_p) ->
        (tokens [n, B], next logits, distinct [n, ...], cache): n steps in one call
        (lax.scan), step j drawing with fold_in(rng, first + j) as `step` does at
        that position; `first` is traced, so one program serves every position.
  Sampling settings and n are static: one program per value."""

  config: ml_collections.ConfigDict
  graphdef: object
  forward: Callable[..., Any]
  prefill: Callable[..., Any]
  step: Callable[..., Any]
  steps: Callable[..., Any]

  @classmethod
  def build(cls, m) -> "DecodePrograms":
    graphdef = abstract_model(m)[0]
    return cls(
      m,
      graphdef,
      jax.jit(functools.partial(_forward, graphdef)),
      jax.jit(functools.partial(_prefill, m, graphdef), static_argnums=4),
      jax.jit(functools.partial(sample_and_forward, graphdef), static_argnums=(5, 6, 7)),
      jax.jit(functools.partial(_sample_and_forward_steps, graphdef), static_argnums=(6, 7, 8, 9)),
    )


_PROGRAMS: dict = {}  # (generation?, config JSON) -> DecodePrograms; 8 most recent kept


def decode_programs(m, *, generation: bool = True) -> DecodePrograms:
  """The programs for m as decoding runs it (generation_config(m); as it is when
  generation=False), built once per config: building a graphdef costs ~0.25 s."""
  key = (generation, m.to_json_best_effort(sort_keys=True))
  if key not in _PROGRAMS:
    programs = DecodePrograms.build(generation_config(m) if generation else m)
    if len(_PROGRAMS) >= 8:
      _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = programs
  return _PROGRAMS[key]


def generate(
  m,
  params,
  rest,
  prompts: list[list[int]],
  *,
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  seed: int = 0,
  eos_id: int | None = None,
  pad_id: int = 0,
) -> Generated:
  """Continue each prompt by max_new_tokens tokens (rows that emit eos_id keep
  going but their tail is cut by Generated.row)."""
  validate_sampling(temperature, top_k, top_p, max_new_tokens)
  longest = max((len(p) for p in prompts), default=0)
  if longest + max_new_tokens > m.max_seq_len:
    raise ConfigError(
      f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) "
      f"exceeds the model's max_seq_len={m.max_seq_len}"
    )
  tokens, mask = left_pad(prompts, pad_id, prompt_bucket(longest))
  programs = decode_programs(m)
  slots = -(-(tokens.shape[1] + max_new_tokens) // CACHE_MULTIPLE) * CACHE_MULTIPLE
  logits, prefill_distinct, cache = programs.prefill(params, rest, tokens, mask, slots)
  # out / distinct: device arrays of [steps,] B / MoE layers, read back once at the end
  rng, out, distinct, i = jax.random.key(seed), [], [], 0
  while max_new_tokens - 1 - i >= DECODE_CHUNK:  # whole chunks, then one step at a time
    tokens, logits, chunk_distinct, cache = programs.steps(
      params, rest, logits, rng, i, cache, DECODE_CHUNK, temperature, top_k, top_p
    )
    out.append(tokens)
    distinct.append(chunk_distinct)
    i += DECODE_CHUNK
  for i in range(i, max_new_tokens):
    if i + 1 < max_new_tokens:
      token, logits, step_distinct, cache = programs.step(
        params, rest, logits, jax.random.fold_in(rng, i), cache, temperature, top_k, top_p
      )
      distinct.append(step_distinct)
    else:  # the last token feeds nothing
      token = sample_tokens(logits, jax.random.fold_in(rng, i), temperature, top_k, top_p)
    out.append(token)
  out, distinct, prefill_distinct = jax.device_get((out, distinct, prefill_distinct))
  prefill_distinct = np.asarray(prefill_distinct)

  def rows(arrays, width):
    return np.concatenate([np.reshape(a, (-1, width)) for a in arrays] or [np.zeros((0, width))])

  return Generated(
    rows(out, len(prompts)).T.astype(np.int32),
    rows(distinct, prefill_distinct.size).astype(np.int32),
    prefill_distinct,
  )
