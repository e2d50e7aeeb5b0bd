"""The l-infinity projected-gradient loop every attack shares, the routing read-outs the
router-targeted attacks need, and the ATTACKS registry.

An attack (`Attack`) is an objective to maximise over a perturbation delta of the
inputs x, |delta|_inf <= epsilon, x + delta in the pixel range [PIXEL_LOW, PIXEL_HIGH]:

  objective(model, x + delta, y, clean) -> float32 scalar
  clean = prepare(model, x): what the objective compares against, read once on x

and how each step's size is set: uniform (PGD; Madry et al. 2018, eq. 2: delta <-
Proj(delta + alpha sign(g))) or per frame, scaled by the frame's local Lipschitz
estimate (`frame_step_sizes`; TLGA, arXiv 2602.01369). `attack_inputs` runs `steps`
such steps from delta = 0 and returns x + delta after every step's projection
(`project`), so |x_adv - x| <= epsilon and the pixel range hold exactly in float32
(tests/contract/test_attack_contract.py). epsilon = 0 returns x itself.

Routing read-outs: every MoE layer's router logits [T, E] and output [B, L, d] on one
forward pass (`moe_readout`, nnx.capture's method outputs, moejax/models/capture.py,
differentiable), and the top-k expert sets of aux["moe"][i]["expert_index"], whose
change between x and x_adv is the routing flip rate (`routing_flip_rate`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from moejax.errors import ConfigError
from moejax.models.capture import captured_forward
from moejax.registry import Registry, check_number

PIXEL_LOW, PIXEL_HIGH = 0.0, 1.0  # inputs are pixels scaled to [0, 1] (moejax/data/vision.py)


@dataclasses.dataclass(frozen=True)
class Attack:
  """objective(model, x_adv, y, clean, settings) -> scalar to maximise; prepare(model,
  x, settings) -> clean (a pytree, default None); per_frame: frame_step_sizes steps on
  clips [B, T, ...]; settings: defaults of its own keys (attack.<name>.<key>)."""

  objective: Callable[..., jax.Array]
  prepare: Callable[..., Any] = lambda model, x, settings: None
  per_frame: bool = False
  settings: tuple[tuple[str, Any], ...] = ()


ATTACKS: Registry[Attack] = Registry("attack.name")


def check_budget(epsilon, steps, step_size=None) -> None:
  """ConfigError naming the key for a negative or non-finite epsilon, steps < 1 or a
  step size <= 0."""
  check_number("attack.epsilon", epsilon, strict=False)
  check_number("attack.steps", steps, integer=True, low=1, strict=False)
  if step_size is not None:
    check_number("attack.step_size", step_size)


def project(x_adv, x, epsilon):
  """x_adv moved into {|x_adv - x| <= epsilon} and [PIXEL_LOW, PIXEL_HIGH], exactly as
  float32 computes x_adv - x: a value whose rounded difference still exceeds epsilon
  moves one float towards x (twice at most)."""
  eps = jnp.asarray(epsilon, x.dtype)
  out = jnp.clip(jnp.clip(x_adv, x - eps, x + eps), PIXEL_LOW, PIXEL_HIGH)
  for _ in range(2):
    out = jnp.where(jnp.abs(out - x) > eps, jnp.nextafter(out, x), out)
  return out


def frame_step_sizes(grad_BxTx___, step_size):
  """Per-frame steps [B, T, 1, ...]: alpha_{b,f} = alpha * T * ||g_{b,f}||_2 /
  sum_f' ||g_{b,f'}||_2, the frame's share of the local Lipschitz estimate ||grad_{delta_f} L||
  (arXiv 2602.01369, TLGA's temporal step rule; the normalisation, mean step alpha over
  the frames, is our guess). A clip with zero gradient everywhere steps alpha per frame."""
  g = grad_BxTx___.astype(jnp.float32)
  norms = jnp.sqrt(jnp.sum(g * g, axis=tuple(range(2, g.ndim))))  # [B, T]
  total = jnp.sum(norms, axis=1, keepdims=True)
  share = jnp.where(total > 0, norms * g.shape[1] / jnp.where(total > 0, total, 1.0), 1.0)
  return (step_size * share).reshape(*share.shape, *[1] * (g.ndim - 2))


def moe_layers(model) -> list[int]:
  """Indices of the model's MoE blocks."""
  return [i for i, block in enumerate(model.blocks) if block.is_moe]


def moe_readout(model, x):
  """(logits, aux, [(router logits [T, E] float32, layer output [B, L, d]) per MoE
  block]) of one differentiable forward pass on x (eval mode)."""
  logits, aux, outputs = captured_forward(model, x)
  layers = [
    (
      outputs[("blocks", i, "ffn", "router_logits")].astype(jnp.float32),
      outputs[("blocks", i, "ffn", "__call__")][0].astype(jnp.float32),
    )
    for i in moe_layers(model)
  ]
  return logits, aux, layers


def cross_entropy(logits, y):
  """Mean cross-entropy of integer labels y, float32."""
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y))


def expert_sets(aux, num_experts: int) -> jax.Array:
  """[layers, T, E] bool: the experts each token is routed to (its top-k), per MoE layer."""
  return jnp.stack(
    [
      jnp.any(jax.nn.one_hot(layer["expert_index"], num_experts, dtype=bool), axis=1)
      & jnp.any(layer["valid"], axis=1, keepdims=True)
      for layer in aux["moe"]
    ]
  )


def routing_flip_rate(model, x, x_adv) -> float:
  """The fraction of routing decisions (token -> expert assignments, every MoE layer)
  that x_adv changes: mean over layers and tokens of |S(x) minus S(x_adv)| / k, S the
  token's top-k expert set."""
  e, k = model.cfg.moe.num_experts, model.cfg.moe.top_k
  _, aux, _ = model(x)
  _, aux_adv, _ = model(x_adv)
  clean, adv = expert_sets(aux, e), expert_sets(aux_adv, e)
  return float(jnp.mean(jnp.sum(clean & ~adv, axis=-1) / k))


def settings_for(attack: Attack, settings=None) -> dict:
  """The attack's settings: `settings` over its declared defaults; ConfigError naming
  attack.<key> for a key it does not declare."""
  defaults = dict(attack.settings)
  unknown = set(settings or {}) - set(defaults)
  if unknown:
    raise ConfigError(f"attack settings {sorted(unknown)} unknown; declared: {sorted(defaults)}")
  return {**defaults, **(settings or {})}


@functools.lru_cache(maxsize=64)
def _compiled(name: str, graphdef, steps: int, settings_items: tuple):
  attack, settings = ATTACKS.get(name), dict(settings_items)

  def run(state, x, y, epsilon, step_size):
    model = nnx.merge(graphdef, state)
    clean = attack.prepare(model, x, settings)

    def objective(delta):
      return attack.objective(nnx.merge(graphdef, state), x + delta, y, clean, settings)

    def step(_, x_adv):
      g = jax.grad(objective)(x_adv - x)
      size = frame_step_sizes(g, step_size) if attack.per_frame and x.ndim == 5 else step_size
      return project(x_adv + size * jnp.sign(g), x, epsilon)

    return jax.lax.fori_loop(0, steps, step, x)

  return jax.jit(run)


def attack_inputs(
  name: str, model, x, y, *, epsilon: float, steps: int = 10, step_size=None, settings=None
):
  """x_adv = x + delta of attack `name` (see the module doc): `steps` projected sign
  steps of size step_size (default 2.5 epsilon / steps, Madry et al. 2018's rule of
  thumb) on model in eval mode. ConfigError naming attack.epsilon for epsilon < 0."""
  attack = ATTACKS.get(name)
  check_budget(epsilon, steps, step_size)
  x = jnp.asarray(x, jnp.float32)
  step_size = 2.5 * epsilon / steps if step_size is None else step_size
  graphdef, state = nnx.split(model)
  items = tuple(sorted(settings_for(attack, settings).items()))
  run = _compiled(name, graphdef, steps, items)
  return run(state, x, jnp.asarray(y, jnp.int32), jnp.float32(epsilon), jnp.float32(step_size))
