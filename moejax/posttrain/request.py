"""The one check of a post-training request (pruning or compression) against the
model it runs on, before any work: every refusal that needs no compute.

Messages name the key the user set, as training errors do (`key=value: why`):
command-line flags by default (FLAGS), study keys when a study passes `keys`
(e.g. {"keep": "study.levels[1].keep", "num_windows": "study.settings.num_windows"}).
"""

from __future__ import annotations

from moejax.models.structure import expert_counts, moe_layer_indices
from moejax.errors import ConfigError, choice_error
from moejax.posttrain import compress_pipeline as cp
from moejax.posttrain import methods, prune

FIELDS = (
  "method",
  "keep",
  "level",
  "objective",
  "rescale",
  "quantizer",
  "group_size",
  "bit_choices",
  "rounds",
  "finetune_steps",
  "num_windows",
  "context",
  "act_bits",
  "rotation",
  "per_output_column",
  "recluster",
)
FLAGS = {field: f"--{field}" for field in FIELDS}
MIN_TOKENS_PER_EXPERT = 16  # routed calibration tokens per expert, on average


def check_request(
  m,
  request,
  *,
  num_windows: int,
  context: int,
  source: str,
  keys: dict | None = None,
  rounds: int = 1,
  finetune_steps: int = 0,
) -> None:
  """ConfigError for a request the model config `m` cannot take.

  request: a prune.Pruning or a compress_pipeline.Request. Calibration (both): no
  MoE layer, a scanned model, a context past max_seq_len, fewer than
  MIN_TOKENS_PER_EXPERT routed tokens per expert. Pruning: an unknown method or
  objective, a keep level that fits no layer, an atom method on non-SwiGLU
  experts, knee with Step's merge, rescale without the rescaled objective.
  Compression: an unknown method or quantizer, a level outside what the method can
  reach, unsupported bits, a group size that does not divide, `rounds` and
  `finetune_steps` the method cannot take, experts that are not float SwiGLU.
  source: how the user named the model ("--workdir=DIR"), for messages that name it."""
  keys = {**FLAGS, **(keys or {})}
  _calibration(m, num_windows, context, source, keys)
  if isinstance(request, prune.Pruning):
    _pruning(m, request, source, keys)
  elif isinstance(request, cp.Request):
    _compression(m, request, source, keys, rounds, finetune_steps)
  else:
    raise TypeError(f"not a post-training request: {request!r}")


def _calibration(m, num_windows: int, context: int, source: str, keys: dict) -> None:
  if not moe_layer_indices(m):
    raise ConfigError(f"the checkpoint has no MoE layer: nothing to prune or compress ({source})")
  if m.scan_layers:
    raise ConfigError(f"model.scan_layers=True: calibration reads the loop layout ({source})")
  if context > m.max_seq_len:
    raise ConfigError(f"{keys['context']}={context} exceeds model.max_seq_len={m.max_seq_len}")
  routed, needed = (
    num_windows * context * m.moe.top_k,
    MIN_TOKENS_PER_EXPERT * max(expert_counts(m)),
  )
  if routed < needed:
    raise ConfigError(
      f"{keys['num_windows']}={num_windows} x {keys['context']}={context} "
      f"routes {routed} token-expert pairs per layer, fewer than "
      f"{MIN_TOKENS_PER_EXPERT} per expert ({needed}) for the calibration "
      "statistics"
    )


def _pruning(m, r: "prune.Pruning", source: str, keys: dict) -> None:
  method, keep = keys["method"], keys["keep"]
  pruner = methods.pruner(r.method, method)
  if pruner.kind == "atom":
    prune.atom_fraction(r.keep, keep)
    if m.moe.experts != "swiglu":
      raise ConfigError(
        f"{method}={r.method} prunes the hidden units of SwiGLU experts, not "
        f"of model.moe.experts={m.moe.experts!r} ({source})"
      )
  elif r.keep == prune.KNEE:
    if pruner.merge != "none":
      raise ConfigError(
        f"{keep}=knee reads err(m) of the Gram objective; {method}={r.method} "
        "merges experts, which that error does not describe"
      )
  else:
    for count in expert_counts(m):
      prune.kept_count(r.keep, count, m.moe.top_k, keep)
  if r.objective not in methods.OBJECTIVES:
    raise choice_error(keys["objective"], r.objective, methods.OBJECTIVES)
  if r.rescale and r.objective != "rescaled":
    raise ConfigError(
      f"{keys['rescale']} folds the least-squares weights of "
      f"{keys['objective']}=rescaled ({keys['objective']}={r.objective})"
    )


def _compression(
  m, r: "cp.Request", source: str, keys: dict, rounds: int, finetune_steps: int
) -> None:
  level, choices_key = keys["level"], keys["bit_choices"]
  cp.family(r.method, keys["method"])
  methods.integer_quantizer(r.quantizer, keys["quantizer"])
  if rounds > 1 and r.method != "gemq":
    raise ConfigError(
      f"{keys['rounds']}={rounds}: only gemq re-estimates its costs ({keys['method']}={r.method})"
    )
  if finetune_steps and not cp.has_expert_type(r.method):
    raise ConfigError(
      f"{keys['finetune_steps']}={finetune_steps}: {r.method} has no expert type to fine-tune"
    )
  if m.moe.experts != "swiglu":
    raise ConfigError(
      f"compression starts from float 'swiglu' experts; this checkpoint "
      f"holds {m.moe.experts!r} experts ({source})"
    )
  if cp.family(r.method) == "factorised":
    if not 0 < r.level < 1:
      raise ConfigError(
        f"{level}={r.level}: a factorisation removes a fraction of the expert parameters, in (0, 1)"
      )
    return
  if not r.bit_choices:
    raise ConfigError(
      f"{choices_key} is empty: expected at least one bit-width of {cp.SUPPORTED_BITS}"
    )
  for b in r.bit_choices:
    if b not in cp.SUPPORTED_BITS:
      raise ConfigError(f"{choices_key}: {b} bits is not supported; valid: {cp.SUPPORTED_BITS}")
  if r.method == "uniform" and r.level not in cp.SUPPORTED_BITS:
    raise ConfigError(f"{level}={r.level}: uniform bits must be one of {cp.SUPPORTED_BITS}")
  low, high = min(cp.SUPPORTED_BITS), max(cp.SUPPORTED_BITS)
  if cp.family(r.method) == "codebook" and not low <= r.level <= high:
    raise ConfigError(
      f"{level}={r.level} bits is outside what {r.method} can reach, [{low}, {high}] bits"
    )
  choices = cp.bit_choices_for(r)
  if r.level < min(choices):
    raise ConfigError(
      f"{level}={r.level} bits is below the minimum achievable, "
      f"{min(choices)} bits for every expert ({choices_key}={list(choices)})"
    )
  if r.level > max(choices):
    raise ConfigError(
      f"{level}={r.level} bits is above the widest choice, {max(choices)} "
      f"({choices_key}={list(choices)})"
    )
  dims = {"d_model": m.d_model, "expert_d_ff": m.moe.expert_d_ff}
  _activations_and_books(r, keys, dims)
  bad = {k: v for k, v in dims.items() if r.group_size and v % r.group_size}
  if r.group_size < 0 or bad:
    raise ConfigError(
      f"{keys['group_size']}={r.group_size} must divide every expert "
      f"matrix's input dimension; it does not divide {bad}"
    )


ROTATIONS = ("", "none", "hadamard", "learned")  # compress_pipeline.Request.rotation


def _activations_and_books(r: "cp.Request", keys: dict, dims: dict) -> None:
  """act_bits supported; the codebook options on codebook methods only, valid."""
  from moejax.experts.compressed import check_act_bits, check_bool

  check_act_bits(keys["act_bits"], r.act_bits)
  check_bool(keys["per_output_column"], r.per_output_column)
  check_bool(keys["recluster"], r.recluster)
  if r.rotation not in ROTATIONS:
    raise choice_error(keys["rotation"], r.rotation, ROTATIONS)
  if cp.family(r.method) != "codebook":
    for key, value in (
      ("rotation", r.rotation),
      ("per_output_column", r.per_output_column),
      ("recluster", r.recluster),
    ):
      if value:
        raise ConfigError(f"{keys[key]}={value!r} is a codebook option; method={r.method}")
    return
  if r.recluster and r.method != "codequant":
    raise ConfigError(
      f"{keys['recluster']}=True re-clusters after centroid fine-tuning, which only "
      f"codequant runs (method={r.method})"
    )
  if cp.codebook_rotation(r) == "hadamard" and any(n & (n - 1) for n in dims.values()):
    raise ConfigError(f"{keys['rotation']}: a Hadamard rotation needs power-of-two dims {dims}")
