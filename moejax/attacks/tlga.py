"""TLGA-R and J-TLGA (arXiv 2602.01369, "temporal Lipschitz-guided attacks" on video
MoE classifiers): `tlga_r` steers every MoE layer's router towards the experts it
trusts least on the clean input, `j_tlga` adds that and an expert term to PGD's
cross-entropy; both step per frame by the frame's local Lipschitz estimate
(moejax/attacks/base.py frame_step_sizes).

The losses are our reading of the paper's description and partly a guess (its exact
terms and weights are not reproduced here):

  L_router(delta) = mean over MoE layers l and tokens t of
                    sum_{e in B_k(t, l)} log R_e(x + delta)              (TLGA-R)
    R = softmax of the router logits; B_k the k experts with the lowest router
    probability on the clean x (fixed during the attack); k = settings k, or the
    model's top_k where 0. Maximising it moves probability onto those experts, so
    the tokens leave their clean top-k.
  L_expert(delta) = mean over MoE layers of ||y_l(x + delta) - y_l(x)||^2 / ||y_l(x)||^2
    y_l the MoE layer's output (the experts' combined output): the experts' answer
    pushed away from their clean one.
  J-TLGA: CE + lambda_R L_router + lambda_E L_expert                    (the paper's
    joint objective; lambda_R = lambda_router, lambda_E = lambda_expert)
"""

import jax
import jax.numpy as jnp

from moejax.attacks.base import ATTACKS, Attack, cross_entropy, moe_readout

TINY = 1e-12


def bottom_k_masks(model, x, settings):
  """Per MoE layer, [T, E] bool: the k experts of lowest clean router probability."""
  k = settings["k"] or model.cfg.moe.top_k
  _, _, layers = moe_readout(model, x)
  masks = []
  for router_logits, _ in layers:
    lowest = jnp.argsort(router_logits, axis=-1)[:, :k]  # ascending: least trusted first
    masks.append(jnp.any(jax.nn.one_hot(lowest, router_logits.shape[-1], dtype=bool), axis=1))
  return masks


def router_loss(layers, masks):
  """L_router of the module doc on a forward pass's read-out `layers`."""
  terms = [
    jnp.mean(jnp.sum(jnp.where(mask, jax.nn.log_softmax(logits, axis=-1), 0.0), axis=-1))
    for (logits, _), mask in zip(layers, masks)
  ]
  return jnp.mean(jnp.stack(terms))


def expert_loss(layers, clean_outputs):
  """L_expert of the module doc."""
  terms = [
    jnp.sum((y - y0) ** 2) / (jnp.sum(y0**2) + TINY) for (_, y), y0 in zip(layers, clean_outputs)
  ]
  return jnp.mean(jnp.stack(terms))


def tlga_r_objective(model, x_adv, y, masks, settings):
  del y, settings
  _, _, layers = moe_readout(model, x_adv)
  return router_loss(layers, masks)


def prepare_joint(model, x, settings):
  """(bottom-k masks, clean MoE layer outputs), read on the clean x."""
  _, _, layers = moe_readout(model, x)
  return bottom_k_masks(model, x, settings), [jax.lax.stop_gradient(y) for _, y in layers]


def j_tlga_objective(model, x_adv, y, clean, settings):
  masks, clean_outputs = clean
  logits, _, layers = moe_readout(model, x_adv)
  return (
    cross_entropy(logits, y)
    + settings["lambda_router"] * router_loss(layers, masks)
    + settings["lambda_expert"] * expert_loss(layers, clean_outputs)
  )


ATTACKS.add(
  "tlga_r",
  Attack(objective=tlga_r_objective, prepare=bottom_k_masks, per_frame=True, settings=(("k", 0),)),
)
ATTACKS.add(
  "j_tlga",
  Attack(
    objective=j_tlga_objective,
    prepare=prepare_joint,
    per_frame=True,
    settings=(("k", 0), ("lambda_router", 0.1), ("lambda_expert", 0.1)),
  ),
)
