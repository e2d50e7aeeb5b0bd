"""The partition and router fitted to the dense model's own generated trajectories
(Prism-MoE, ICML 2026: only the abstract was read; the procedure below is our
guess at "choose the partition and the router initialisation to fit the dense
model's own trajectories, minimising ||FFN(x) - sum_{e in top-k} g_e FFN_e(x)||^2").

Trajectories: sequences sampled from the dense model itself at temperature 1 from
the start-of-document token (`generate_trajectories`); each layer's FFN inputs x
on them are captured (the ffn_norm outputs).

Per layer (fitted on the dense model's inputs, layer by layer, not on the partly
converted model's: a guess):
  1. neuron activations h_tj = silu(x_t . g_j) (x_t . u_j) and output magnitudes
     a_tj = |h_tj| ||w_down[j]||;
  2. candidate partitions: balanced Hartigan k-means (partition.py) of the neurons'
     co-activation profiles a[:, j] (raw, and normalised per neuron) and of their
     keys; tokens subsampled to at most `profile_tokens` (guess);
  3. for each candidate, the router: ridge regression of each token's centred
     log expert-output norms log ||FFN_e(x_t)|| on x_t (a guess at the router
     initialisation), so the router ranks experts by their contribution;
  4. the candidate whose top-k output has the least squared error on the fitting
     trajectories wins.
Every router kernel is rescaled so that its logits have standard deviation
ROUTER_STD on the fitting tokens: the renormalised top-k weights are then near
1/k and the experts' w_down carries a factor k (convert.py), i.e. near-unit gates
(our choice; the top-k order is unchanged by the scale).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.conversion import partition

ROUTER_STD = 0.05
RIDGE = 1e-3


def generate_trajectories(
  m, params, rest, count: int, length: int, seed: int, prefix_id: int
) -> np.ndarray:
  """[count, 1 + length] int32: the prefix token and `length` tokens sampled from
  the dense model at temperature 1."""
  from moejax.inference.generate import generate

  out = generate(
    m, params, rest, [[prefix_id]] * count, max_new_tokens=length, temperature=1.0, seed=seed
  )
  return np.concatenate(
    [np.full((count, 1), prefix_id, np.int32), np.asarray(out.tokens, np.int32)], axis=1
  )


def ffn_inputs_and_logits(m, params, rest, tokens) -> tuple[list[np.ndarray], np.ndarray]:
  """(each block's FFN input [B*L, d] float32, logits [B, L, V] float32) on tokens."""
  from moejax.models.capture import captured_forward
  from moejax.models.decoder import abstract_model

  graphdef = abstract_model(m)[0]

  @jax.jit
  def run(params, rest, tokens):
    logits, _, outputs = captured_forward(nnx.merge(graphdef, params, rest), tokens)
    return logits.astype(jnp.float32), [
      outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, m.d_model).astype(jnp.float32)
      for i in range(m.num_layers)
    ]

  logits, xs = jax.device_get(run(params, rest, jnp.asarray(tokens)))
  return [np.asarray(x, np.float64) for x in xs], np.asarray(logits)


def neuron_activations(x, w_gate, w_up) -> np.ndarray:
  """h [T, F] = silu(x W_gate) * (x W_up), float64."""
  g = x @ np.asarray(w_gate, np.float64)
  return g / (1 + np.exp(-g)) * (x @ np.asarray(w_up, np.float64))


def expert_outputs(h, w_down, labels, experts: int) -> np.ndarray:
  """[T, E, d]: each group's output with unit gate (sum over e = the dense FFN)."""
  w_down = np.asarray(w_down, np.float64)
  return np.stack([h[:, labels == e] @ w_down[labels == e] for e in range(experts)], 1)


def fit_router(x, outs) -> np.ndarray:
  """[d, E]: ridge regression of the centred log expert-output norms on x (doc, 3)."""
  target = np.log(np.linalg.norm(outs, axis=-1) + 1e-12)
  target -= target.mean(1, keepdims=True)
  gram = x.T @ x
  ridge = RIDGE * np.trace(gram) / gram.shape[0] + 1e-12
  return np.linalg.solve(gram + ridge * np.eye(gram.shape[0]), x.T @ target)


def scaled_router(router, x) -> np.ndarray:
  """router rescaled so that its logits on x have standard deviation ROUTER_STD."""
  std = float((x @ router).std())
  return router * (ROUTER_STD / std) if std > 0 else router


def top_k_output(x, outs, router, k: int) -> np.ndarray:
  """[T, d]: sum over the router's top-k experts of k w_e FFN_e(x), w the renormalised
  softmax weights (float64): the converted layer's output."""
  logits = x @ router
  probs = np.exp(logits - logits.max(1, keepdims=True))
  probs /= probs.sum(1, keepdims=True)
  top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
  w = np.take_along_axis(probs, top, 1)
  w = k * w / w.sum(1, keepdims=True)
  return np.einsum("tk,tkd->td", w, np.take_along_axis(outs, top[..., None], 1))


def layer_mse(x, h, w_down, labels, router, k: int, experts: int) -> float:
  """Mean over tokens of ||FFN(x) - converted(x)||^2."""
  outs = expert_outputs(h, w_down, labels, experts)
  return float(((outs.sum(1) - top_k_output(x, outs, router, k)) ** 2).sum(-1).mean())


def fit_layer(x, w_gate, w_up, w_down, experts: int, k: int, seed: int, profile_tokens: int = 512):
  """(labels [F], router [d, E], {candidate: fitting MSE}) of one layer (doc)."""
  h = neuron_activations(x, w_gate, w_up)
  a = np.abs(h) * np.linalg.norm(np.asarray(w_down, np.float64), axis=1)
  pick = np.random.default_rng(seed).permutation(x.shape[0])[:profile_tokens]
  profiles = a[pick].T  # [F, tokens]
  candidates = {
    "coactivation": profiles,
    "coactivation_normalised": profiles / (np.linalg.norm(profiles, axis=1, keepdims=True) + 1e-12),
    "keys": partition.neuron_keys(w_gate),
  }
  best: tuple[str, np.ndarray, np.ndarray] | None = None
  fits: dict[str, float] = {}
  for name, points in candidates.items():
    labels, _ = partition.balanced_kmeans(points, experts, "hartigan", seed=seed)
    router = scaled_router(fit_router(x, expert_outputs(h, w_down, labels, experts)), x)
    fits[name] = layer_mse(x, h, w_down, labels, router, k, experts)
    if best is None or fits[name] < fits[best[0]]:
      best = (name, labels, router)
  if best is None:
    raise ValueError("no candidate partition")
  return best[1], best[2], fits
