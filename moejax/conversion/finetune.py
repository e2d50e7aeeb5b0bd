"""Fine-tuning a converted MoE, with or without Prism-MoE's confidence-adaptive
routing supervision (supervision.py), for a study to compare both on the same data.

Objective per batch: next-token cross-entropy + the MoE's aux losses (what
moejax/train/step.py trains) + `weight` * mean over MoE layers of
routing_supervision(router logits, q, 1 - c), where c is the frozen dense model's
max next-token probability on the same inputs and q each expert's share of the
layer's output norm under the current experts (held constant: stop_gradient).
The optimizer is the run config's (train/optimizer.make_optimizer: AdamW, warmup,
cosine). Batches: windows of the training token stream drawn with `seed`, the
same for every arm of a draw. Guesses: the supervision's weight and target
(supervision.py); the paper's own loop was not read.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from moejax.conversion import supervision


def windows(stream: np.ndarray, steps: int, batch: int, seq_len: int, seed: int) -> np.ndarray:
  """[steps, batch, seq_len + 1] int32 training windows (inputs and shifted targets)."""
  from moejax.posttrain.calibration import calibration_windows

  w = calibration_windows(stream, steps * batch, seq_len + 1, seed=seed)
  return w.reshape(steps, batch, seq_len + 1)


def make_loss(dense_m, moe_m, weight: float):
  """loss(params, rest, dense_params, dense_rest, tokens [B, L + 1]) -> (loss, (ce, sup))."""
  from moejax.models.capture import captured_forward
  from moejax.models.decoder import abstract_model
  from moejax.train.step import cross_entropy

  moe_graph, dense_graph = abstract_model(moe_m)[0], abstract_model(dense_m)[0]
  k, d = moe_m.moe.top_k, moe_m.d_model

  def loss(params, rest, dense_params, dense_rest, tokens):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    model = nnx.merge(moe_graph, params, rest)
    if not weight:
      logits, aux, _ = model(inputs)
      ce = cross_entropy(logits, targets)
      return ce + aux["aux_loss"], (ce, jnp.float32(0))
    logits, aux, outputs = captured_forward(model, inputs)
    ce = cross_entropy(logits, targets)
    dense_logits = nnx.merge(dense_graph, dense_params, dense_rest)(inputs)[0]
    confidence = jax.lax.stop_gradient(supervision.confidence_weight(dense_logits)).reshape(-1)
    terms = []
    for i in range(moe_m.num_layers):
      x = outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, d).astype(jnp.float32)
      ffn = params["blocks"][i]["ffn"]
      e = jax.tree.map(lambda w: jax.lax.stop_gradient(w).astype(jnp.float32), ffn["experts"])
      outs = (
        jnp.einsum(
          "tef,efd->ted",
          jax.nn.silu(jnp.einsum("td,edf->tef", x, e["w_gate"]))
          * jnp.einsum("td,edf->tef", x, e["w_up"]),
          e["w_down"],
        )
        / k
      )
      target = jax.lax.stop_gradient(supervision.output_share(outs))
      router_logits = x @ ffn["router_kernel"].astype(jnp.float32)
      terms.append(supervision.routing_supervision(router_logits, target, confidence))
    sup = jnp.mean(jnp.stack(terms))
    return ce + aux["aux_loss"] + weight * sup, (ce, sup)

  return loss


def finetune(config, dense_m, dense_params, dense_rest, params, rest, batches, weight: float):
  """(params, [(ce, supervision)] per step) after one step per batch of `batches`
  [steps, B, L + 1] (module doc); `config`: the converted run's (optimizer)."""
  from moejax.train.optimizer import make_optimizer

  optimizer = make_optimizer(config.train)
  grad = jax.value_and_grad(make_loss(dense_m, config.model, weight), has_aux=True)

  @jax.jit
  def step(params, opt_state, frozen, tokens):
    (_, terms), g = grad(params, *frozen, tokens)
    updates, opt_state = optimizer.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, terms

  params, frozen = jax.tree.map(jnp.asarray, (params, (rest, dense_params, dense_rest)))
  opt_state, log = optimizer.init(params), []
  for tokens in batches:
    params, opt_state, terms = step(params, opt_state, frozen, jnp.asarray(tokens))
    log.append(tuple(float(t) for t in terms))
  return jax.tree.map(np.asarray, params), log
