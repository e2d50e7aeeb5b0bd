"""Compression of a trained MoE's experts, end to end: calibrate,
choose bits or ranks, compress every MoE layer, and build the model that holds
the compressed form (a registered expert type), or the float model that equals
it, for scoring.

Methods (`METHODS`), by family and what `level` means:

  quantized   level = average code bits per expert weight (GEMQ's budget)
    uniform     every expert at `level` bits (an integer in SUPPORTED_BITS)
    per_layer   GEMQ's costs, each layer allocated alone at the same average
    gemq        GEMQ: one global multiple-choice knapsack over every expert
                (bit_allocation.allocate on gemq.expert_costs)
    with quantizer 'rtn' or 'gptq' (GPTQ's H = X_e^T X_e of the tokens routed
    to expert e, expert_inputs.py).
  codebook    level = average index bits; a fractional level takes GEMQ's global
              allocation (RTN costs, the fewest bit choices around it)
    kmeans      Lloyd's k-means per group, no rotation
    codequant   CodeQuant: Hadamard rotation, k-means, centroid fine-tuning on
                each expert's routed calibration inputs
  factorised  level = fraction of the routed expert parameters removed
    td_moe      TD-MoE: joint Tucker per projection, input and output modes
                whitened, ranks allocated over the three modes of each tensor
                within its share (never above its dense size)
    tucker      the same without whitening
    svd         per-expert truncated SVD at equal parameters per tensor (a baseline)
    whitened_svd  per-expert SVD of the whitened weights (SVD-LLM style)

`compress` returns a `Compressed`: per MoE block the float weights the method
produces (dequantized / reconstructed: the float model that equals the
compressed one, for scoring and GEMQ's re-estimation), the arrays of the expert
type that stores it, and the counts. The per-expert SVD baselines have no expert
type: they are scored from their float weights, their parameters counted.
`compressed_model` builds the model with the compressed expert type and
`save_workdir` writes it as a training workdir; `experiments.train` continues
it, which is how GEMQ's router fine-tuning runs (train.trainable='router':
router parameters only, LM loss, AdamW; `router_finetune_config`).

GEMQ's progressive bit reduction (compress_workdir.run, `rounds`): the budget
is lowered round by round (e.g. 3, 2.5, 2 bits); each round allocates on costs
measured on the model the previous round left (quantized experts, fine-tuned
routers) against the float experts' outputs (gemq.expert_costs), quantizes the
float experts and fine-tunes the routers again.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_collections
import numpy as np

from moejax.experts import codebook as codebook_type
from moejax.experts import quantized as quantized_type
from moejax.experts.compressed import MATRICES, SUPPORTED_BITS
from moejax.posttrain import bit_allocation, compress, factorise, methods, tucker
from moejax.posttrain.calibration import Calibration
from moejax.posttrain.methods import CODEBOOK, QUANTIZED, family  # noqa: F401  (re-exported)
from moejax.posttrain.parts import Names, names

FACTORISED = Names(lambda: names(methods.DECOMPOSITIONS))  # the decompositions' names, live
METHODS = methods.COMPRESSION
QUANTIZERS = compress.QUANTIZERS
DEFAULT_BIT_CHOICES = (2, 3, 4, 8)
CENTROID_STEPS = 50  # CodeQuant centroid fine-tuning steps per expert matrix (a guess)


@dataclasses.dataclass(frozen=True)
class Request:
  method: str
  level: float
  quantizer: str = "gptq"
  group_size: int = 32
  bit_choices: tuple = DEFAULT_BIT_CHOICES
  seed: int = 0
  damping: float = 1e-6  # whitening: C = X^T X / n + damping * mean(diag) I (tucker.py)
  act_bits: int = 0  # the expert matmuls' inputs fake-quantized (experts/compressed.py)
  # codebooks only: '' the method's rotation (codequant: hadamard; kmeans: none), or
  # none / hadamard / learned; a book per output column; re-clustering after fine-tuning
  rotation: str = ""
  per_output_column: bool = False
  recluster: bool = False


def has_expert_type(method: str) -> bool:
  """Whether an expert type stores what `method` makes (not a per-expert SVD baseline)."""
  return family(method) != "factorised" or methods.decomposition(method).kind == "joint"


def bit_choices_for(r: Request) -> tuple:
  """The bit-widths an allocation may pick: the request's for quantized methods;
  for a codebook at a fractional level, the two supported widths around it."""
  if family(r.method) == "codebook" and r.level != int(r.level):
    below = max(b for b in SUPPORTED_BITS if b < r.level)
    above = min(b for b in SUPPORTED_BITS if b > r.level)
    return (below, above)
  return tuple(sorted(r.bit_choices))


def expert_weights(params: dict, block: int) -> dict:
  experts = params["blocks"][block]["ffn"]["experts"]
  return {m: np.asarray(experts[m], np.float32) for m in MATRICES}


def with_expert_weights(params: dict, weights: dict) -> dict:
  """A copy of params (shared leaves) with {block: {w_gate, w_up, w_down}} replaced."""
  import jax

  new = jax.tree.map(lambda leaf: leaf, params)
  for block, w in weights.items():
    new["blocks"][block]["ffn"]["experts"] = {**new["blocks"][block]["ffn"]["experts"], **w}
  return new


def allocation(r: Request, calibration: Calibration, current: dict | None = None) -> dict:
  """{block: bits [E]} for a quantized or codebook request."""
  blocks = [layer.block for layer in calibration.inputs]
  num_experts = expert_weights(calibration.params, blocks[0])["w_gate"].shape[0]
  if r.level == int(r.level) and (r.method == "uniform" or family(r.method) == "codebook"):
    return {b: np.full(num_experts, int(r.level)) for b in blocks}
  bits = bit_choices_for(r)
  blocks, costs = calibration.costs(bits, r.group_size, current)
  flat = costs.reshape(-1, len(bits))
  if r.method == "per_layer":
    picked = bit_allocation.per_layer(flat, bits, r.level, np.repeat(blocks, num_experts))
  else:
    picked = bit_allocation.allocate(flat, bits, r.level)
  chosen = np.asarray(bits)[picked].reshape(len(blocks), num_experts)
  return dict(zip(blocks, chosen))


@dataclasses.dataclass
class Compressed:
  """One compressed model: per MoE block its float weights and the stored arrays."""

  kind: str  # quantized | codebook | codebook_rotated | factorised | baseline (an expert type)
  # {block: {w_gate, w_up, w_down}} float32 (weights only: the activation quantizer,
  # settings act_bits, runs in the compressed model alone)
  float_weights: dict
  arrays: dict  # {block: the expert type's arrays} (none for baselines)
  settings: dict  # the expert type's config section
  report: dict  # bits / ranks per block, parameter counts


def _quantized(r, params, calibration, current=None) -> Compressed:
  bits = allocation(r, calibration, current)
  float_weights, arrays = {}, {}
  for layer in calibration.inputs:
    w = expert_weights(params, layer.block)
    needs = "hessians" in methods.integer_quantizer(r.quantizer).needs
    hessians = layer.hessians(len(bits[layer.block])) if needs else None
    a = compress.quantized_from_float(
      w, bits[layer.block], r.group_size, quantizer=r.quantizer, hessians=hessians
    )
    arrays[layer.block] = a
    float_weights[layer.block] = _float32(quantized_type.dense_weights(a, jnp.float32))
  settings = {
    "bits": int(max(max(b) for b in bits.values())),
    "group_size": r.group_size,
    "symmetric": False,
    "act_bits": r.act_bits,
  }
  return Compressed("quantized", float_weights, arrays, settings, _bits_report(bits))


def _float32(weights: dict) -> dict:
  return {m: np.asarray(weights[m], np.float32) for m in MATRICES}


def _bits_report(bits: dict) -> dict:
  all_bits = np.concatenate(list(bits.values()))
  return {
    "bits": {int(b): [int(x) for x in v] for b, v in bits.items()},
    "average_bits": float(all_bits.mean()),
  }


def codebook_rotation(r: Request) -> str:
  """The request's rotation: its own, else the method's (codequant: hadamard)."""
  return r.rotation or ("hadamard" if r.method == "codequant" else "none")


def _codebook(r, params, calibration) -> Compressed:
  bits = allocation(r, calibration)
  rotation = codebook_rotation(r)
  tuned = r.method == "codequant"
  float_weights, arrays = {}, {}
  for layer in calibration.inputs:
    w = expert_weights(params, layer.block)
    num_experts = w["w_gate"].shape[0]
    inputs = (
      {m: [layer.expert_rows(e, m) for e in range(num_experts)] for m in MATRICES}
      if tuned or rotation == "learned"
      else None
    )
    a = compress.codebook_from_float(
      w,
      [int(b) for b in bits[layer.block]],
      r.group_size,
      rotation=rotation,
      seed=r.seed,
      calibration_inputs=inputs,
      finetune_steps=CENTROID_STEPS if tuned else 0,
      per_output_column=r.per_output_column,
      recluster=r.recluster,
      act_bits=r.act_bits,
    )
    arrays[layer.block] = a
    stored = {k: np.asarray(v, np.float32) for k, v in a.items()}
    fold = "none" if rotation == "learned" else rotation  # learned: R stored in `a`
    float_weights[layer.block] = _float32(
      codebook_type.dense_weights(stored, jnp.float32, fold, r.per_output_column)
    )
  settings = {
    "bits": int(max(max(b) for b in bits.values())),
    "group_size": r.group_size,
    "per_output_column": r.per_output_column,
    "act_bits": r.act_bits,
    **({} if rotation == "learned" else {"rotation": rotation}),
  }
  kind = codebook_type.ROTATED if rotation == "learned" else "codebook"
  return Compressed(kind, float_weights, arrays, settings, _bits_report(bits))


FACTORS = ("core", "expert_factor", "input_factor", "output_factor")  # a joint model's arrays


def _factorised(r, params, calibration) -> Compressed:
  """Every stacked projection of every layer keeps (1 - level) of its dense
  parameters (tucker.tensor_budgets), each decomposed on its own by the
  decomposition r.method (methods.DECOMPOSITIONS): TD-MoE's per-tensor rank
  allocation, and the baselines at the same per-tensor budgets. A joint one is
  stored by expert type 'factorised'; a per-expert one is a baseline."""
  method = methods.decomposition(r.method)
  decompose = method.bind_from({"damping": r.damping})
  layers = calibration.inputs
  weights = {layer.block: expert_weights(params, layer.block) for layer in layers}
  budgets = {
    layer.block: dict(
      zip(
        MATRICES, tucker.tensor_budgets([weights[layer.block][m].shape for m in MATRICES], r.level)
      )
    )
    for layer in layers
  }
  joint = method.kind == "joint"
  float_weights: dict[int, dict] = {}
  arrays: dict[int, dict] = {}
  report: dict[int, dict] = {}
  parameters: dict[int, dict] = {}
  for layer in layers:
    w, block = weights[layer.block], int(layer.block)
    outputs = (
      factorise.routed_outputs(w, layer.rows, layer.hidden, layer.expert)
      if "outputs" in method.needs
      else None
    )
    float_weights[layer.block], report[block], parameters[block] = {}, {}, {}
    factors: dict[str, dict] = {}
    for m in MATRICES:
      model = decompose(
        w[m],
        budgets[layer.block][m],
        inputs=(layer.hidden if m == "w_down" else layer.inputs)
        if "inputs" in method.needs
        else None,
        outputs=None if outputs is None else outputs[m],
      )
      if joint:  # what FactorisedExperts stores, float32, and the float model of it
        factors[m] = {k: np.asarray(getattr(model, k), np.float32) for k in FACTORS}
        float_weights[layer.block][m] = tucker.reconstruct(
          *(factors[m][k] for k in FACTORS)
        ).astype(np.float32)
        report[block][m] = list(model.ranks)
      else:
        float_weights[layer.block][m] = model.reconstruct().astype(np.float32)
        report[block][m] = model.ranks
      parameters[block][m] = model.parameters
    if joint:
      arrays[layer.block] = factors
  counts = _factorised_report(weights, budgets, report, parameters)
  if not joint:
    return Compressed("baseline", float_weights, {}, {}, counts)
  padded = {m: tuple(max(report[b][m][k] for b in report) for k in range(3)) for m in MATRICES}
  return Compressed("factorised", float_weights, arrays, {"ranks": padded}, counts)


def _factorised_report(weights, budgets, ranks, parameters) -> dict:
  return {
    "ranks": ranks,
    "tensor_parameters": parameters,
    "tensor_budgets": {int(b): v for b, v in budgets.items()},
    "parameters": int(sum(sum(p.values()) for p in parameters.values())),
    "budget": int(sum(sum(v.values()) for v in budgets.values())),
    "dense_parameters": int(sum(w[m].size for w in weights.values() for m in MATRICES)),
  }


def compress_experts(
  r: Request, params: dict, calibration: Calibration, current: dict | None = None
) -> Compressed:
  """The Compressed model of `r` from the float params (module doc); `current`:
  the params GEMQ's costs are measured on (default the float model)."""
  kind = family(r.method)
  if kind == "quantized":
    return _quantized(r, params, calibration, current)
  if kind == "codebook":
    return _codebook(r, params, calibration)
  return _factorised(r, params, calibration)


def router_finetune_config(
  config,
  steps: int,
  learning_rate: float = 1e-4,
  weight_decay: float = 1e-4,
  start_step: int = 0,
  aux_losses: bool = False,
):
  """The training config of GEMQ's router fine-tuning (router only, AdamW at a
  constant `learning_rate`, `steps` steps after `start_step`). The official code
  trains on the LM loss alone: every model.moe.loss_weights entry is 0 and the
  aux-loss-free bias stays fixed, unless `aux_losses` (then the model's own)."""
  c = ml_collections.ConfigDict(config.to_dict())
  t = c.train
  t.trainable, t.learning_rate, t.weight_decay = "router", learning_rate, weight_decay
  t.warmup_steps, t.min_lr_ratio = 0, 1.0
  t.steps = start_step + steps
  t.log_every = t.eval_every = t.checkpoint_every = max(1, steps)
  t.eval_batches, t.progress_bar, t.max_to_keep = 4, False, 2
  if not aux_losses:
    moe = c.model.moe
    for name in moe.loss_weights:
      moe.loss_weights[name] = 0.0
    moe.routing.bias_update_rate = 0.0
  return c


def calibration_free(r: Request) -> bool:
  """Whether the model of `r` depends on neither the calibration windows nor the
  seed: a decomposition that reads no calibration data (per-expert SVD, plain
  Tucker), or uniform bits with a quantizer that reads none (RTN)."""
  if family(r.method) == "factorised":
    return not methods.decomposition(r.method).needs
  return r.method == "uniform" and not methods.integer_quantizer(r.quantizer).needs
