"""Step (ICML 2026, "Less Token, More Signal"; abstract only, the mechanism below
follows /work/shared/specs/PAPERS.md, ICML entry 18): token-selective expert
scores, then prune and merge.

On calibration windows, with the next-token loss L:
  1. keep the top-rho tokens S by their own loss (the informative ones);
  2. score expert e of MoE layer l by the first-order (Taylor) change of the loss
     when its output is removed on those tokens,
        I_e = sum_{t in S} | <dL/dy_t, g_{t,e} E_e(x_t)> |,
     y_t the layer's output; dL/dy comes from the layer's gradient probe
     (MoELayer.gradient_probe under nnx.capture with nnx.Perturbation);
  3. prune the lowest-scored experts and, by the merge rule (prune.MERGES: `none`,
     or `average`, the routing-mass-weighted mean of the raw parameters,
     merging.experts.merge_in_layer), merge each pruned expert into the kept expert whose
     outputs on the same calibration tokens are most similar (prune.PARTNERS:
     `output`, the cosine of contributions.LayerStatistics.outputs; `contribution`,
     the cosine of the routed-contribution Gram, measures co-activation instead).
Guesses: loss (not gradient norm) selects the tokens; the similarity measure;
the averaging of raw weights of experts trained apart for the merge.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.posttrain.contributions import routed_contributions


def _loss_with_probes(model, perturbations, tokens):
  """(mean next-token loss, (per-token loss [T], per MoE layer (x [T, d], aux))), the
  MoE outputs perturbed by `perturbations` (zeros: their gradients are dL/dy)."""
  (logits, aux, _), captured = nnx.capture(
    model, nnx.Intermediate, method_outputs=nnx.Intermediate, init=perturbations
  )(tokens)
  outputs = {path: value.get_value()[0] for path, value in nnx.to_flat_state(captured)}
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  token_loss = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  moe = [
    (outputs[("blocks", i, "ffn_norm", "__call__")].reshape(-1, model.cfg.d_model), a)
    for i, a in zip([i for i, b in enumerate(model.blocks) if b.is_moe], aux["moe"])
  ]
  return jnp.mean(token_loss), (token_loss, moe)


def token_gradients(graphdef, params, rest, tokens):
  """(dL/dy per MoE block [B*L, d], {block: (its input x [B*L, d], its aux)}, per-token
  loss [B*(L-1)]) with L the mean next-token loss over the B*(L-1) predicted tokens
  (the last position predicts nothing: its gradient rows are 0). Traceable."""

  def fresh():
    return nnx.merge(graphdef, params, rest)

  _, perturbations = nnx.capture(fresh(), nnx.Perturbation)(tokens)
  grad_fn = jax.grad(lambda p: _loss_with_probes(fresh(), p, tokens), has_aux=True)
  grads, (token_loss, moe) = grad_fn(perturbations)
  flat = {path: v.get_value() for path, v in nnx.to_flat_state(grads)}
  blocks = [i for i, b in enumerate(fresh().blocks) if b.is_moe]
  dy = {
    block: flat[("blocks", block, "ffn", "output")].reshape(x.shape[0], -1).astype(jnp.float32)
    for block, (x, _) in zip(blocks, moe)
  }
  return dy, dict(zip(blocks, moe)), token_loss.reshape(-1)


@functools.partial(jax.jit, static_argnums=0)
def token_taylor_terms(graphdef, params, rest, tokens):
  """Per token the loss [B*(L-1)], and per MoE layer the per-token, per-expert
  terms <dL/dy_t, g_{t,e} E_e(x_t)> [B*L, E] (the last position's are 0). L is the
  batch's summed loss (N times its mean), so terms of batches of any size add up
  and rank together (layer_step_scores)."""
  dy, moe, token_loss = token_gradients(graphdef, params, rest, tokens)
  model = nnx.merge(graphdef, params, rest)
  summed = token_loss.shape[0]  # d(sum of losses) = N d(mean loss)
  terms = [
    summed
    * jnp.einsum("td,ted->te", dy[block], routed_contributions(model.blocks[block].ffn, x, aux))
    for block, (x, aux) in moe.items()
  ]
  return token_loss, terms


def step_scores(token_loss_T: np.ndarray, terms_TxE: np.ndarray, rho: float) -> np.ndarray:
  """I_e over the top-rho tokens by loss (module doc); terms_TxE rows are aligned
  with the tokens whose loss is given (callers drop the last position)."""
  loss = np.asarray(token_loss_T, np.float64)
  keep = max(1, int(round(rho * loss.size)))
  selected = np.argsort(-loss, kind="stable")[:keep]
  return np.abs(np.asarray(terms_TxE, np.float64)[selected]).sum(axis=0)


def layer_step_scores(graphdef, params, rest, batches, rho: float) -> list[np.ndarray]:
  """Per MoE layer, I_e over every calibration batch's top-rho tokens together: each
  batch's per-token terms stay paired with that batch's losses, and the scores do
  not depend on how the windows are split into batches, nor on their order."""
  losses: list[np.ndarray] = []
  terms: list[np.ndarray] = []
  for tokens in batches:
    tokens = jnp.asarray(tokens)
    token_loss, layer_terms = token_taylor_terms(graphdef, params, rest, tokens)
    b, length = tokens.shape
    predicting = np.ones((b, length), bool)
    predicting[:, -1] = False  # positions that predict a next token
    losses.append(np.asarray(token_loss))
    rows = [np.asarray(t)[predicting.reshape(-1)] for t in layer_terms]
    terms = [np.concatenate([a, r]) for a, r in zip(terms, rows)] if terms else rows
  loss = np.concatenate(losses)
  return [step_scores(loss, t, rho) for t in terms]
