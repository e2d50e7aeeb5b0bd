"""How far a converted MoE is from its dense source on held-out trajectories: the
logit KL(dense || MoE) per position and each FFN layer's output squared error on
the dense model's own FFN inputs (the quantity trajectory.py fits)."""

import numpy as np
from flax import nnx

from moejax.conversion import trajectory


def log_softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def logit_kl(dense_logits, moe_logits) -> float:
  """Mean over positions of KL(softmax(dense) || softmax(moe)), float64."""
  p, q = log_softmax(dense_logits), log_softmax(moe_logits)
  return float((np.exp(p) * (p - q)).sum(-1).mean())


def moe_layer_mse(x, dense_ffn: dict, moe_ffn: dict, top_k: int) -> float:
  """Mean over tokens x [T, d] of ||dense FFN(x) - the converted MoE layer(x)||^2."""
  h = trajectory.neuron_activations(x, dense_ffn["gate"]["kernel"], dense_ffn["up"]["kernel"])
  dense = h @ np.asarray(dense_ffn["down"]["kernel"], np.float64)
  e = {name: np.asarray(v, np.float64) for name, v in moe_ffn["experts"].items()}
  outs = np.stack(
    [
      trajectory.neuron_activations(x, e["w_gate"][i], e["w_up"][i]) @ e["w_down"][i] / top_k
      for i in range(e["w_gate"].shape[0])
    ],
    1,
  )
  moe = trajectory.top_k_output(x, outs, np.asarray(moe_ffn["router_kernel"], np.float64), top_k)
  return float(((dense - moe) ** 2).sum(-1).mean())


def held_out(m, params, rest, moe_m, moe_params, tokens) -> dict:
  """{'kl': logit KL, 'mse': mean over layers of moe_layer_mse} on tokens [B, L]."""
  from moejax.models.decoder import abstract_model

  xs, dense_logits = trajectory.ffn_inputs_and_logits(m, params, rest, tokens)
  moe = nnx.merge(abstract_model(moe_m)[0], moe_params, rest)
  moe_logits = np.asarray(moe(np.asarray(tokens))[0], np.float64)
  mse = [
    moe_layer_mse(
      xs[i], params["blocks"][i]["ffn"], moe_params["blocks"][i]["ffn"], moe_m.moe.top_k
    )
    for i in range(m.num_layers)
  ]
  return {"kl": logit_kl(dense_logits, moe_logits), "mse": float(np.mean(mse))}
