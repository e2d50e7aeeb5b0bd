"""Sparse upcycling: an MoE model started from a trained dense checkpoint.

`--config.init.upcycle_from=DENSE_WORKDIR [--config.init.upcycle_step=N]`
starts an MoE run from the dense model's checkpoint (Komatsuzaki et al. 2023,
"Sparse Upcycling", arXiv 2212.05055): attention, norms, embeddings and head
are copied, every MoE layer's experts come from that layer's dense FFN and the
router starts fresh. With fine-grained experts (expert_d_ff < d_ff) the dense
FFN of width F is cut into G = F / expert_d_ff column segments and expert e
takes segment e mod G, each segment copied E / G times: the partition-and-copy
of Qwen1.5-MoE's upcycling (its 50% re-initialisation is not done here).

Scaling (our choice, not from either paper): w_down is multiplied by top_k.
With renormalised top-k weights, a token whose top-k experts hold each segment
once with equal weights 1/top_k (top_k = G) gets the dense FFN's output
exactly; a zero router does this (ties pick experts 0..k-1), which
tests/train/test_upcycle.py checks on the whole model's logits. Sparse
Upcycling copies the whole FFN into every expert (G = 1) and does not scale.

A merged-experts layer's base expert (model.moe.merge 'ep_camex', 'namex';
moejax/experts/merged.py) starts as a copy of expert 0, as CAMEx's code does
(`init_res`); with G = 1 every task vector then starts at 0.
"""

import os

import jax
import ml_collections
import numpy as np

from moejax.errors import ConfigError
from moejax.train.checkpoint import Checkpointer
from moejax.train.restore import load_from_workdir

EXPERT_FROM_DENSE = {"w_gate": "gate", "w_up": "up", "w_down": "down"}
# model keys that must agree between the dense source and the MoE (all but the FFN)
SHARED_MODEL_KEYS = (
  "vocab_size",
  "d_model",
  "num_layers",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "tie_embeddings",
  "scan_layers",
)


def source_config(config):
  """The dense source run's config (from its checkpoint metadata), checked against
  `config`; raises ConfigError naming init.upcycle_from before anything is built."""
  where = f"init.upcycle_from={config.init.upcycle_from}"
  if not os.path.isdir(os.path.join(config.init.upcycle_from, "checkpoints")):
    raise ConfigError(f"{where}: not a training workdir (no checkpoints/)")
  ckpt = Checkpointer(config.init.upcycle_from, read_only=True)
  steps = ckpt.all_steps()
  step = config.init.upcycle_step or (steps[-1] if steps else None)
  if step not in steps:
    ckpt.close()
    raise ConfigError(f"{where}: no checkpoint of step {step}; it holds {steps}")
  dense = ml_collections.ConfigDict(ckpt.read_meta(step)["config"])
  ckpt.close()
  m, d = config.model, dense.model
  if d.ffn_type != "dense" or m.ffn_type != "moe":
    raise ConfigError(
      f"{where}: upcycling starts an MoE (model.ffn_type={m.ffn_type!r}) "
      f"from a dense model (its ffn_type is {d.ffn_type!r})"
    )
  for key in SHARED_MODEL_KEYS:
    if m[key] != d[key]:
      raise ConfigError(f"{where}: model.{key}={m[key]!r} but the dense model has {d[key]!r}")
  width, experts = m.moe.expert_d_ff, m.moe.num_experts
  if d.d_ff % width or experts % (d.d_ff // width):
    raise ConfigError(
      f"{where}: the dense d_ff={d.d_ff} must be a multiple of "
      f"model.moe.expert_d_ff={width}, and model.moe.num_experts={experts} "
      f"a multiple of the {d.d_ff / width:g} segments"
    )
  if m.scan_layers:
    raise ConfigError(
      f"{where}: model.scan_layers=True is not supported (upcycle the "
      "loop model, then train it scanned)"
    )
  if m.moe.first_dense or list(m.moe.dense_layers) or m.moe.every_n != 1:
    raise ConfigError(
      f"{where}: every layer must be an MoE layer (first_dense=0, dense_layers=[], every_n=1)"
    )
  return dense, step


def upcycle_params(dense_params: dict, moe_params: dict, top_k: int) -> dict:
  """A copy of `moe_params` with everything but the routers taken from the dense
  model and each layer's experts cut from its dense FFN (module doc)."""
  out = {key: dense_params[key] for key in moe_params if key != "blocks"}
  out["blocks"] = {}
  for i, block in moe_params["blocks"].items():
    dense_block = dense_params["blocks"][i]
    new = {k: dense_block[k] for k in block if k != "ffn"}
    ffn = dict(block["ffn"])  # the router keeps its fresh initialisation
    experts = {}
    for name, dense_name in EXPERT_FROM_DENSE.items():
      num_experts, *shape = np.shape(ffn["experts"][name])
      w = np.asarray(dense_block["ffn"][dense_name]["kernel"])
      axis = 0 if name == "w_down" else 1  # the d_ff axis
      width = shape[axis]
      segments = np.split(w, w.shape[axis] // width, axis=axis)
      stacked = np.stack([segments[e % len(segments)] for e in range(num_experts)])
      experts[name] = stacked * top_k if name == "w_down" else stacked
    ffn["experts"] = experts
    if "merge_base" in ffn:  # the first MoE layer's only, under NAMEx
      ffn["merge_base"] = {name: w[:1].copy() for name, w in experts.items()}
    new["ffn"] = ffn
    out["blocks"][i] = new
  return out


def upcycled(config, moe_params: dict, moe_rest: dict):
  """(params, rest) of the MoE of `config` upcycled from init.upcycle_from."""
  _, step = source_config(config)
  _, _, dense_params, _, _ = load_from_workdir(config.init.upcycle_from, step)
  dense_params, moe_params = jax.tree.map(np.asarray, (dense_params, moe_params))
  return upcycle_params(dense_params, moe_params, config.model.moe.top_k), moe_rest
