"""Validation of a whole config before anything is built or compiled: every key's
value, the parts' own settings against the registries, and the combinations the
trainer cannot run (each a ConfigError naming the key and value). What needs a
training workdir to check (init.upcycle_from) the trainer checks itself
(moejax/train/init_from.check_sources)."""

import math

from moejax import dispatch, experts, losses, routing, sharding
from moejax.adapters.projection import (
  check_adapted_ffn,
  validate_adapter_training,
  validate_projection_adapter,
)
from moejax.config import (
  ATTENTION_KINDS,
  BALANCE_STATISTICS,
  DTYPES,
  FFN_TYPES,
  QK_NORMS,
  ROPE_SCALINGS,
  TASKS,
  TRAINABLE,
  parts_with_settings,
)
from moejax.errors import ConfigError, choice_error
from moejax.models.structure import layer_moe_config, moe_layer_indices
from moejax.registry import section_of


def validate_part_settings(e) -> None:
  """Every part's section, whatever the part in use: no unknown keys, no flat keys
  of older configs, values its own validation accepts; and no unknown section in
  a group of sections (model.moe.losses)."""
  parts = parts_with_settings()
  for part in parts:
    part.check(e)
  groups: dict[str, set[str]] = {}  # 'losses' -> the loss names with a section
  for part in parts:
    group, _, name = part.path.rpartition(".")
    if group:
      groups.setdefault(group, set()).add(name)
  for group, names in groups.items():
    unknown = set(section_of(e, group) or ()) - names
    if unknown:
      raise ConfigError(
        f"model.moe.{group} has unknown sections {sorted(unknown)}; known: {sorted(names)}"
      )


def _positive(key, value, strict=True):
  if value < 0 or (strict and value == 0):
    raise ConfigError(f"{key}={value} must be {'> 0' if strict else '>= 0'}")


def validate_config(c) -> None:
  """Reject bad values before any model is built (see module doc)."""
  from moejax.models import MODELS

  MODELS.get(c.model_name)
  if not c.init.get("hf_dir") and c.model.family != "moejax":
    raise ConfigError(
      f"model.family={c.model.family!r} is fine-tuned from a pretrained "
      f"checkpoint, and init.hf_dir is not set: give --config.init.hf_dir=DIR "
      f"(init.hf_dir=None)"
    )
  if not c.init.get("hf_dir") and c.init.get("requires_hf_dir"):
    raise ConfigError(
      "this config fine-tunes a pretrained model (init.requires_hf_dir=True) "
      "and init.hf_dir is not set: give --config.init.hf_dir=DIR"
    )
  validate_model(c.model)
  if not c.init.get("hf_dir"):  # else the model that trains is the directory's (init_from)
    check_adapted_ffn(c.model, c.model.num_layers - len(moe_layer_indices(c.model)))
  validate_task(c)
  m = c.model
  if c.data.seq_len > m.max_seq_len:
    raise ConfigError(f"data.seq_len={c.data.seq_len} exceeds model.max_seq_len={m.max_seq_len}")
  _positive("data.seq_len", c.data.seq_len)
  _positive("data.batch_size", c.data.batch_size)
  if c.data.name == "mix":
    from moejax.data.mix import check_weights

    check_weights(c.data.mix.weights)
  if c.data.name == "files":
    from moejax.data.files import resolve_files

    resolve_files(c.data.files)
  from moejax.data.l3_allocation import validate_allocation
  from moejax.layers.lookup import validate_l3

  validate_l3(c)
  validate_allocation(c)
  t = c.train
  _positive("train.steps", t.steps)
  _positive("train.learning_rate", t.learning_rate)
  for key in ("log_every", "eval_every", "checkpoint_every", "max_to_keep"):
    _positive(f"train.{key}", t[key])
  _positive("train.warmup_steps", t.warmup_steps, strict=False)
  for key in ("param_dtype", "opt_state_dtype"):
    if t[key] not in DTYPES:
      raise choice_error(f"train.{key}", t[key], DTYPES)
  if t.trainable not in TRAINABLE:
    raise choice_error("train.trainable", t.trainable, TRAINABLE)
  validate_adapter_training(c)
  sharding.validate_sharding_config(c)
  validate_micro_batches(c, fixed_batch_shards(c))


def validate_task(c) -> None:
  """task, data.name and model_name agree: 'classification' trains the ViT on an image
  dataset (moejax/data/vision.py) whose shape and classes model.vit matches."""
  from moejax.data.vision import VISION_DATASETS

  task = c.get("task", "lm")
  if task not in TASKS:
    raise choice_error("task", task, TASKS)
  if c.model_name == "vit":
    from moejax.models.vit import validate_vit

    validate_vit(c)
  elif c.train.get("trainable") in ("prompt", "head"):
    raise ConfigError(
      f"train.trainable={c.train.trainable!r} tunes the ViT's prompts or "
      f"head: model_name='vit', not {c.model_name!r}"
    )
  if task in ("lm", "distill"):
    if c.data.name in VISION_DATASETS:
      raise ConfigError(f"data.name={c.data.name!r} is an image dataset: set task='classification'")
    return
  if c.data.name not in VISION_DATASETS:
    raise ConfigError(
      f"task='classification' needs an image dataset; data.name="
      f"{c.data.name!r} is not one of {sorted(VISION_DATASETS)}"
    )
  if c.model_name != "vit":
    raise ConfigError(
      f"task='classification' trains model_name='vit', not model_name={c.model_name!r}"
    )
  dataset, v = VISION_DATASETS[c.data.name], c.model.vit
  shape = (v.image_size, v.image_size, v.num_channels)
  if shape != dataset.image_shape or v.num_classes != dataset.num_classes:
    raise ConfigError(
      f"model.vit (image_size, num_channels, num_classes)="
      f"{(v.image_size, v.num_channels, v.num_classes)} does not match "
      f"data.name={c.data.name!r}: images {dataset.image_shape}, "
      f"{dataset.num_classes} classes"
    )
  if v.get("frames", 1) != 1:
    raise ConfigError(
      f"model.vit.frames={v.frames}: data.name={c.data.name!r} holds images (give 1; "
      "videos are made in memory, moejax/data/moving_digits.py)"
    )


def fixed_batch_shards(c) -> int:
  """Shards the mesh splits the batch into, when the config fixes them (no -1 among
  the batch axes; otherwise 1 here, and the loop checks again with the devices)."""
  rules = sharding.parse_rules(c.sharding.rules)
  sizes = [c.mesh[a] for a in rules["batch"]]
  return 1 if -1 in sizes else math.prod(sizes)


def validate_micro_batches(c, batch_shards: int = 1) -> None:
  """train.micro_batches: >= 1, dividing each batch shard's rows, and a model whose
  training step is the same with micro-batches (moejax/train/step.py)."""
  m, batch = c.train.micro_batches, c.data.batch_size
  if isinstance(m, bool) or not isinstance(m, int) or m < 1:
    raise ConfigError(f"train.micro_batches={m!r} must be an int >= 1")
  if c.train.balance_statistics not in BALANCE_STATISTICS:
    raise choice_error("train.balance_statistics", c.train.balance_statistics, BALANCE_STATISTICS)
  if batch % m:
    raise ConfigError(f"train.micro_batches={m} must divide data.batch_size={batch}")
  if batch_shards > 1 and (batch // batch_shards) % m:
    raise ConfigError(
      f"train.micro_batches={m} must divide the {batch // batch_shards} rows "
      f"of each of the {batch_shards} batch shards (data.batch_size={batch}): "
      "every micro-batch keeps rows on every shard"
    )
  if m == 1:
    return
  if c.model.ffn_type == "moe":
    spec = routing.get_router(c.model.moe.router)
    if spec.init_state is not None and (c.model.scan_layers or c.model.remat != "none"):
      raise ConfigError(
        f"train.micro_batches={m} with model.scan_layers={c.model.scan_layers} "
        f"and model.remat={c.model.remat!r}: the stateful router "
        f"model.moe.router={c.model.moe.router!r} updates its state inside "
        "the scanned or rematerialised block; use the loop without remat"
      )
    routing.base.check_micro_batches(spec, routing.router_config(spec, c.model.moe), m)
    losses.check_step_statistics(c.model.moe.loss_weights, m, c.train.balance_statistics)


def validate_model(m) -> None:
  """The `model` section: every family, trained or imported (ConfigError names the key)."""
  for key in (
    "vocab_size",
    "d_model",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "d_ff",
    "max_seq_len",
  ):
    _positive(f"model.{key}", m[key])
  for key, value, choices in (
    ("model.dtype", m.dtype, DTYPES),
    ("model.ffn_type", m.ffn_type, FFN_TYPES),
    ("model.attention.kind", m.attention.kind, ATTENTION_KINDS),
    ("model.attention.qk_norm", m.attention.qk_norm, QK_NORMS),
    ("model.rope.scaling", m.rope.scaling, ROPE_SCALINGS),
  ):
    if value not in choices:
      raise choice_error(key, value, choices)
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(
      f"model.num_heads={m.num_heads} must be a multiple of model.num_kv_heads={m.num_kv_heads}"
    )
  if m.head_dim % 2:
    raise ConfigError(f"model.head_dim={m.head_dim} must be even for RoPE")
  if len(m.attention.windows) not in (0, m.num_layers):
    raise ConfigError(
      f"model.attention.windows has {len(m.attention.windows)} entries "
      f"for model.num_layers={m.num_layers} (give none or one per layer)"
    )
  if m.ffn_type == "moe":
    validate_moe(m.moe, m.num_layers)
  counts = m.moe.expert_counts
  if counts and len(counts) != len(moe_layer_indices(m)):
    raise ConfigError(
      f"model.moe.expert_counts has {len(counts)} entries for "
      f"{len(moe_layer_indices(m))} MoE layers"
    )
  for i in range(len(counts)):
    spec = routing.get_router(m.moe.router)
    if spec.validate is not None:
      spec.validate(routing.router_config(spec, layer_moe_config(m, i)))
  validate_projection_adapter(m)
  from moejax.models.decoder import REMAT_POLICIES, scan_layer_differences

  if m.remat not in REMAT_POLICIES:
    raise choice_error("model.remat", m.remat, REMAT_POLICIES)
  if m.scan_layers and scan_layer_differences(m):
    raise ConfigError(
      f"model.scan_layers=True needs identical layers; "
      f"{scan_layer_differences(m)} (keep the loop: model.scan_layers=False)"
    )


def validate_placement(e, num_layers: int) -> None:
  """Which layers are sparse: model.moe.first_dense, every_n."""
  _positive("model.moe.every_n", e.every_n)
  if not 0 <= e.first_dense < num_layers:
    raise ConfigError(
      f"model.moe.first_dense={e.first_dense} must be in [0, model.num_layers={num_layers})"
    )


def validate_moe(e, num_layers: int) -> None:
  if e.num_experts < 1:
    raise ConfigError(
      f"model.moe.num_experts={e.num_experts} must be >= 1 "
      "(use model.ffn_type='dense' for a dense model)"
    )
  _positive("model.moe.expert_d_ff", e.expert_d_ff)
  validate_placement(e, num_layers)
  validate_part_settings(e)  # routing, dispatch, grouped matmul and shared expert too
  spec = routing.get_router(e.router)
  if spec.validate is not None:
    spec.validate(routing.router_config(spec, e))
  if e.loss_weights and not spec.gives_probs:
    raise ConfigError(
      f"model.moe.loss_weights={dict(e.loss_weights)}: model.moe.router="
      f"{e.router!r} forms no probabilities over all experts, so no loss "
      "applies (set model.moe.loss_weights={})"
    )
  dispatch.get_dispatcher(e.dispatch)
  validate_experts(e)
  for name, weight in e.loss_weights.items():
    losses.get_loss(name)
    _positive(f"model.moe.loss_weights.{name}", weight, strict=False)


def validate_experts(e) -> None:
  """model.moe.experts and grouped_matmul against the registries (moejax/experts,
  moejax/dispatch/grouped_matmul.py; no names are listed here); their settings
  sections are checked by validate_part_settings."""
  from moejax.dispatch.grouped_matmul import resolve_grouped_matmul

  expert_type = experts.get_expert_type(e.experts)  # settings: validate_part_settings
  matmul = resolve_grouped_matmul(
    e.grouped_matmul, expert_type.bind({}, e), config_key="model.moe.grouped_matmul"
  )
  if matmul.fused and not expert_type.fused:
    raise ConfigError(
      f"model.moe.grouped_matmul={e.grouped_matmul!r} runs the expert type's "
      f"fused path; model.moe.experts={e.experts!r} declares none"
    )
