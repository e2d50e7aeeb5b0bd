"""A dense decoder converted into an MoE decoder whose experts partition each
dense FFN (Prism-MoE, ICML 2026; MoEfication, arXiv 2110.01786).

Attention, norms, embeddings and head are copied. Block i's FFN of width F becomes
E SwiGLU experts of width F / E (partition.split_ffn) under a `topk` router with
renormalised weights; each expert's w_down is multiplied by top_k, so weights of
1/k give unit gates (as moejax/train/upcycle.py scales). With top_k = E and a zero
router the MoE computes the dense model exactly (tests/conversion/).

Routers: `trajectory` fits partition and router together (trajectory.py); the
other partitions get the MoEfication-style centroid router (each group's mean
gate column, partition.centroid_router; MoEfication trains an MLP router instead).
Every router is rescaled to logits of std trajectory.ROUTER_STD on the trajectory
tokens, so every kind starts with near-unit gates and differs only in which
experts it picks.
"""

import ml_collections
import numpy as np

from moejax.conversion import partition, trajectory
from moejax.errors import ConfigError


def check_source(m, experts: int, top_k: int, where: str) -> None:
  """ConfigError (one line naming `where`) unless `m` is a dense decoder whose FFN
  width E divides and top_k <= E."""
  if not 1 <= top_k <= experts:
    raise ConfigError(f"top_k={top_k} must be in [1, experts={experts}] ({where})")
  if m.ffn_type != "dense":
    raise ConfigError(
      f"the source must be a dense model; its model.ffn_type is {m.ffn_type!r} ({where})"
    )
  partition.check_groups(m.d_ff, experts, f" ({where})")


def moe_model(dense_m, experts: int, top_k: int) -> ml_collections.ConfigDict:
  """The MoE twin of the dense model config: every layer E experts of width d_ff / E."""
  m = ml_collections.ConfigDict(dense_m.to_dict())
  m.ffn_type = "moe"
  e = m.moe
  e.num_experts, e.top_k, e.expert_d_ff = experts, top_k, dense_m.d_ff // experts
  e.router, e.routing.renormalize, e.experts = "topk", True, "swiglu"
  e.shared.count, e.first_dense, e.dense_layers, e.every_n = 0, 0, [], 1
  e.expert_counts = []
  return m


def fit_partitions(
  kind: str,
  m,
  params: dict,
  xs: list,
  experts: int,
  top_k: int,
  seed: int,
  details: list | None = None,
) -> list:
  """[(labels [F], router [d, E])] per block; xs: each block's FFN inputs on the
  fitting trajectories (router scale; `trajectory`: the fit). `details` (a list)
  receives, per block, the trajectory fit's MSE of each candidate partition."""
  if kind not in partition.KINDS:
    raise ConfigError(f"unknown partition {kind!r}; one of {', '.join(partition.KINDS)}")
  out = []
  for i in range(m.num_layers):
    ffn = params["blocks"][i]["ffn"]
    w_gate, w_up, w_down = (np.asarray(ffn[n]["kernel"]) for n in ("gate", "up", "down"))
    if kind == "trajectory":
      labels, router, fits = trajectory.fit_layer(
        xs[i], w_gate, w_up, w_down, experts, top_k, seed + i
      )
      if details is not None:
        details.append(fits)
    else:
      if kind == "random":
        labels = partition.random_partition(m.d_ff, experts, seed + i)
      else:
        labels, _ = partition.balanced_kmeans(
          partition.neuron_keys(w_gate), experts, kind.removeprefix("kmeans_"), seed=seed + i
        )
      router = trajectory.scaled_router(
        partition.centroid_router(partition.neuron_keys(w_gate), labels, experts), xs[i]
      )
    out.append((labels, router))
  return out


def convert_params(dense_params: dict, fitted: list, experts: int, top_k: int) -> dict:
  """The MoE's params: the dense ones with each block's FFN split (module doc)."""
  out = {key: value for key, value in dense_params.items() if key != "blocks"}
  out["blocks"] = {}
  for i, block in dense_params["blocks"].items():
    labels, router = fitted[int(i)]
    ffn = block["ffn"]
    split = partition.split_ffn(
      ffn["gate"]["kernel"], ffn["up"]["kernel"], ffn["down"]["kernel"], labels, experts
    )
    dtype = np.asarray(ffn["down"]["kernel"]).dtype
    split = {
      name: np.asarray(w * (top_k if name == "w_down" else 1), dtype) for name, w in split.items()
    }
    out["blocks"][i] = {
      **{k: v for k, v in block.items() if k != "ffn"},
      "ffn": {"experts": split, "router_kernel": np.asarray(router, np.float32)},
    }
  return out


def convert(
  m,
  params: dict,
  rest: dict,
  kind: str,
  experts: int,
  top_k: int,
  *,
  seed: int = 0,
  trajectories: int = 16,
  length: int = 64,
  prefix_id: int = 0,
  details: list | None = None,
):
  """(MoE model config, params, the fitting trajectories [N, 1 + length]) of the dense
  model (m, params, rest) (loop layout, host arrays); details: fit_partitions'."""
  check_source(m, experts, top_k, "the dense model")
  tokens = trajectory.generate_trajectories(
    m, params, rest, trajectories, min(length, m.max_seq_len - 1), seed, prefix_id
  )
  xs, _ = trajectory.ffn_inputs_and_logits(m, params, rest, tokens)
  fitted = fit_partitions(kind, m, params, xs, experts, top_k, seed, details)
  return moe_model(m, experts, top_k), convert_params(params, fitted, experts, top_k), tokens


def training_config(config, moe_m, budget: float) -> ml_collections.ConfigDict:
  """The dense run's config with the MoE model, training for `budget` of the dense
  run's steps (warmup 5%, a checkpoint every 10%) from step 0."""
  out = ml_collections.ConfigDict(config.to_dict())
  out.model = moe_m
  t, steps = out.train, max(1, round(budget * config.train.steps))
  t.steps, t.warmup_steps = steps, steps // 20
  t.checkpoint_every, t.eval_every = max(1, steps // 10), max(1, steps // 4)
  t.log_every = min(t.log_every, steps)
  out.init.upcycle_from, out.init.hf_dir = None, None
  return out


def convert_workdir(
  workdir: str,
  out: str,
  kind: str,
  experts: int,
  top_k: int,
  *,
  seed: int = 0,
  trajectories: int = 16,
  length: int = 64,
  budget: float = 0.1,
) -> dict:
  """Convert the dense training workdir's latest checkpoint into a training workdir
  at `out` (step 0, a fresh optimizer, the dense run's data position) that
  experiments.train continues; returns the held-out KL and MSE (measure.py) on
  trajectories of another seed, also written to out/conversion.json."""
  import json
  import os

  from moejax.conversion import measure
  from moejax.models.decoder import unstack_layers
  from moejax.posttrain import source as source_lib
  from moejax.validation import validate_config

  src = source_lib.load_training(workdir)
  check_source(src.model, experts, top_k, src.where)
  m, params, rest = unstack_layers(src.model, src.params, src.rest)
  prefix = src.eos_id if src.eos_id is not None else 0
  fits: list[dict] = []
  moe_m, moe_params, _ = convert(
    m,
    params,
    rest,
    kind,
    experts,
    top_k,
    seed=seed,
    trajectories=trajectories,
    length=length,
    prefix_id=prefix,
    details=fits,
  )
  config = training_config(src.config, moe_m, budget)
  validate_config(config)
  held = trajectory.generate_trajectories(
    m, params, rest, trajectories, min(length, m.max_seq_len - 1), seed + 1, prefix
  )
  report = {
    "partition": kind,
    "experts": experts,
    "top_k": top_k,
    "seed": seed,
    "source": workdir,
    "source_step": src.step,
    "train_steps": config.train.steps,
    "held_out": measure.held_out(m, params, rest, moe_m, moe_params, held),
    "fitting_mse_by_candidate": fits,
  }  # trajectory: per block, the least one wins
  source_lib.save_training_workdir(out, config, moe_params, rest, 0, src.data_state)
  with open(os.path.join(out, "conversion.json"), "w") as f:
    json.dump(report, f, indent=1)
  return report
