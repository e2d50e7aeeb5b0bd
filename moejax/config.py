"""The full config schema with defaults, and its validation.

Experiment files in configs/ start from `base_config()` and change what they
need, so every key exists and `--config.a.b=value` overrides always work.
`validate_config` runs before anything is built or compiled and raises a
ConfigError naming the bad key and value.
"""
import math

import ml_collections

from moejax import dispatch, experts, losses, routing, sharding
from moejax.errors import ConfigError, choice_error
from moejax.registry import PartSettings, section_of

FFN_TYPES = ("dense", "moe")
DTYPES = ("float32", "bfloat16")
ATTENTION_KINDS = ("gqa", "mla")
QK_NORMS = ("none", "per_head", "across_heads")
ROPE_SCALINGS = ("default", "yarn")
BALANCE_STATISTICS = ("step", "micro_batch")  # train.balance_statistics
TRAINABLE = ("all", "router")  # train.trainable


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model_name = "decoder"  # a registered model (moejax.models.MODELS)

  # The one model schema (moejax/models/decoder.py): these defaults are the
  # 'moejax' family preset (the Shakespeare LM); moejax/interop/hf_config.py
  # fills the same keys from an HF config.json for the released families.
  c.model = m = ml_collections.ConfigDict()
  m.family = "moejax"  # moejax | mixtral | qwen2_moe | qwen3_moe | olmoe | deepseek_v3
  m.vocab_size = 256
  m.d_model = 128
  m.num_layers = 4
  m.num_heads = 4
  m.num_kv_heads = 2
  m.head_dim = 32
  m.d_ff = 512  # dense FFN width (dense layers and the dense twin)
  m.max_seq_len = 1024  # longest sequence (HF max_position_embeddings)
  m.norm_eps = 1e-6
  m.dtype = "float32"  # compute dtype; parameters: train.param_dtype (default float32)
  m.tie_embeddings = False  # the embedding table is the output projection
  m.ffn_type = "moe"  # dense | moe; which layers: moe.first_dense, every_n
  # The scale skeleton (moejax/models/decoder.py): jax.lax.scan over identical
  # layers (one block compiled, not num_layers), and rematerialisation by a named
  # policy: none | full | dots | save_moe_routing (keep the routing, recompute experts).
  m.scan_layers = False
  m.remat = "none"
  # Rotary embeddings (moejax/layers/rope.py): 'default' or 'yarn' frequencies;
  # interleave pairs 2i with 2i+1 (DeepSeek) instead of rotate-half.
  m.rope = ml_collections.ConfigDict(dict(
      theta=10000.0, scaling="default", interleave=False, factor=1.0,
      original_max_position=4096, beta_fast=32.0, beta_slow=1.0, mscale=0.0,
      mscale_all_dim=0.0, attention_factor=0.0, truncate=True))
  # Attention (moejax/layers/attention.py): 'gqa' or 'mla' (DeepSeek latent);
  # qk_norm none | per_head (Qwen3) | across_heads (OLMoE); clip_qkv 0 = off;
  # windows: per-layer sliding window, [] or 0 = full causal.
  m.attention = ml_collections.ConfigDict(dict(
      kind="gqa", qkv_bias=False, out_bias=False, qk_norm="none", clip_qkv=0.0, windows=[]))
  m.attention.mla = ml_collections.ConfigDict(dict(
      q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0))

  m.moe = e = ml_collections.ConfigDict()
  e.num_experts = 8
  e.top_k = 2
  e.expert_d_ff = 256  # fine-grained experts: independent of d_ff
  e.num_shared_experts = 0
  e.shared_d_ff = 256
  e.every_n = 1
  e.first_dense = 0
  e.dense_layers = []  # further layers kept dense (HF mlp_only_layers)
  e.expert_counts = []  # experts per MoE layer after pruning ([] = num_experts everywhere)
  e.shared_expert_gate = False  # sigmoid(x w) scales the shared expert (Qwen2-MoE)
  e.router = "topk"
  e.renormalize = True
  e.router_jitter = 0.0
  e.router_init_scale = 0.1
  # Routing keys of the model schema, kept flat (not in one router's section): the
  # HF families read and write them (moejax/interop/hf_config.py: DeepSeek-V3
  # n_group, topk_group, routed_scaling_factor) and they decide what a loaded model
  # computes; more than one router reads routed_scaling_factor and the bias rate.
  e.num_groups = 1  # expert groups (group-limited routing)
  e.topk_groups = 1  # ... and the groups each token may use
  e.bias_update_rate = 1e-3  # aux-loss-free bias step (0: a loaded bias stays fixed)
  e.routed_scaling_factor = 1.0
  # Expert type (moejax/experts): swiglu | atomic; its own settings: model.moe.<type>.
  e.experts = "swiglu"
  e.dispatch = "dropless"
  # dropless only, moejax/dispatch/grouped_matmul.py: auto | fused | loop | tiled | ragged_dot | gmm
  e.grouped_matmul = "auto"
  # grouped_matmul 'gmm' (also 'auto' on TPU/GPU): kernels.BACKENDS, checked when gmm is used
  e.gmm_backend = "auto"
  e.dropless_tile = 128  # rows per expert tile in the dropless layout (the padding unit)
  e.dropless_block = 512  # rows per matmul block of the loop paths (loop, dropless_memeff)
  # their smallest block: each expert's rows are computed up to a multiple of
  # gcd(dropless_tile, dropless_min_block); 64 for fine-grained experts (a few hundred
  # rows per expert: +5-8% fwd+bwd); default: the tile, as before (moejax/dispatch/blocks.py)
  e.dropless_min_block = 128
  e.capacity_factor = 1.25
  e.min_capacity = 4
  e.loss_weights = ml_collections.ConfigDict({"load_balance": 1e-2, "z_loss": 1e-3})
  # Each part's own settings (a router's, an expert type's, a loss's) are in its
  # section, added here from the registries at the defaults the part declares:
  # model.moe.<router or expert type> (model.moe.sere.rho, model.moe.atomic.activation)
  # and model.moe.losses.<loss> (model.moe.losses.dpsl.alpha); see moejax/registry.py.
  add_part_sections(e)

  # L3 Large Lookup Layers (moejax/layers/lookup.py): static token-id routing to
  # a CSR table of `budget` rows, <= cap per token id, one L3 layer after each
  # block in `layers`; rows allocated by `allocation` from `corpus`'s train split.
  m.l3 = l3 = ml_collections.ConfigDict()
  l3.enabled = False
  l3.layers = (1,)
  l3.budget = 4096  # R, total rows (>= vocab_size: one row per token id at least)
  l3.cap = 64  # max rows per token id (the paper: 512)
  l3.d_emb = 64
  l3.d_up = 128
  l3.allocation = "lzw"  # lzw | frequency | uniform
  # shakespeare | shakespeare_folio (byte tokens) | train_split (this run's data.name
  # train split through data.tokenizer: any vocabulary)
  l3.corpus = "shakespeare"

  c.data = d = ml_collections.ConfigDict()
  d.name = "shakespeare"
  d.tokenizer = "byte"
  d.vocab_size = 256  # for learned tokenizers
  d.seq_len = 128
  d.batch_size = 32
  d.data_dir = ml_collections.config_dict.placeholder(str)
  d.text_key = "text"
  d.train_split = "train"
  d.eval_split = "validation"
  # data.name="mix" (moejax/data/mix.py): training interleaves the domains in
  # these proportions (a domain left out or at 0 is not trained on); eval_split
  # "validation" is every held-out document, "validation_<domain>" one domain's.
  d.mix = ml_collections.ConfigDict(dict(weights=ml_collections.ConfigDict(dict(
      drama=1.0, prose=1.0, speeches=1.0, code=1.0, facts=0.5, arithmetic=0.5))))
  # data.name=polyglot_synth (issue 13): the planted task's settings; the defaults
  # are moejax.data.polyglot.DEFAULTS (a test keeps the two equal).
  d.polyglot = ml_collections.ConfigDict(dict(
      num_languages=4, pool_size=24, alphabet_size=12, branching=3, doc_len=128,
      train_docs=4096, eval_docs=512, seed=0))
  # data.name="files" (moejax/data/files.py): globs of .txt / .jsonl files (.jsonl:
  # one document per line, under text_key), streamed from disk. eval unset: every
  # 10th train file (sorted) is held out whole.
  d.files = ml_collections.ConfigDict(dict(
      train=ml_collections.config_dict.placeholder(str),
      eval=ml_collections.config_dict.placeholder(str)))

  # Start from pretrained weights (moejax/train/init_from.py): an HF checkpoint
  # directory or a converted workdir. The model section then comes from it
  # (model.family must name its family); the MoE training keys stay the config's.
  c.init = ml_collections.ConfigDict()
  c.init.hf_dir = ml_collections.config_dict.placeholder(str)
  # Sparse upcycling (moejax/train/upcycle.py): an MoE started from a dense training
  # workdir's checkpoint (upcycle_step; 0 = its latest), experts cut from its FFNs.
  c.init.upcycle_from = ml_collections.config_dict.placeholder(str)
  c.init.upcycle_step = 0

  c.train = t = ml_collections.ConfigDict()
  t.steps = 2000
  t.learning_rate = 3e-3
  t.warmup_steps = 100
  t.min_lr_ratio = 0.1
  t.weight_decay = 0.1
  t.b1 = 0.9
  t.b2 = 0.95
  t.grad_clip = 1.0
  t.log_every = 50
  t.eval_every = 200
  t.eval_batches = 16
  t.checkpoint_every = 200
  t.max_to_keep = 2
  t.progress_bar = True
  # Gradient accumulation: the step's batch (data.batch_size rows) runs as this many
  # strided micro-batches, one optimizer update and one router-state update per step
  # (moejax/train/step.py); 4 x 8 rows is the step of one batch of 32.
  t.micro_batches = 1
  # Batch statistics of the router losses under micro-batches (moejax/train/step.py):
  # 'step' (exact: one extra forward per step gives every micro-batch the whole
  # step's load fractions) or 'micro_batch' (each micro-batch its own, as in
  # MaxText / Megatron: no extra forward, a different load-balance loss).
  t.balance_statistics = "step"
  # Dtype policy (moejax/train/step.py): parameters and optimizer moments are stored
  # in these; the update runs in float32, activations in model.dtype (the compute
  # dtype), router parameters and router math stay float32 whatever the policy.
  t.param_dtype = "float32"
  t.opt_state_dtype = "float32"
  # Which parameters the optimizer updates (moejax/train/step.py): 'all', or
  # 'router' (router parameters only, every other update zero: GEMQ's router
  # fine-tuning of a quantized model, moejax/posttrain/compress_pipeline.py).
  t.trainable = "all"

  # Device mesh (moejax/sharding.py): axis sizes, -1 = the devices left over.
  # One device in all: the plain single-device program.
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))
  c.sharding = s = ml_collections.ConfigDict()
  s.rules = ml_collections.ConfigDict(sharding.rules_as_strings())  # logical -> "axis,axis"
  s.all_to_all = "auto"  # expert-parallel exchange: auto | ragged (TPU/GPU) | fixed
  s.a2a_capacity_factor = 0.0  # 0: receive buffers that never overflow; f > 0: f x mean load
  return c


def parts_with_settings() -> list[PartSettings]:
  """The settings section of every registered router, expert type and loss that
  declares settings (moejax/registry.py, PartSettings)."""
  return [spec.config_section
          for registry in (routing.ROUTERS, experts.EXPERT_TYPES, losses.LOSSES)
          for _, spec in registry.items() if spec.settings]


def add_part_sections(e) -> None:
  """model.moe.<part> and model.moe.losses.<loss>: every part's declared defaults."""
  for part in parts_with_settings():
    part.add_defaults(e)


def validate_part_settings(e) -> None:
  """Every part's section, whatever the part in use: no unknown keys, no flat keys
  of older configs, values its own validation accepts; and no unknown section in
  a group of sections (model.moe.losses)."""
  parts = parts_with_settings()
  for part in parts:
    part.check(e)
  groups = {}  # 'losses' -> the loss names with a section
  for part in parts:
    group, _, name = part.path.rpartition(".")
    if group:
      groups.setdefault(group, set()).add(name)
  for group, names in groups.items():
    unknown = set(section_of(e, group) or ()) - names
    if unknown:
      raise ConfigError(f"model.moe.{group} has unknown sections {sorted(unknown)}; "
                        f"known: {sorted(names)}")


def _positive(key, value, strict=True):
  if value < 0 or (strict and value == 0):
    raise ConfigError(f"{key}={value} must be {'> 0' if strict else '>= 0'}")


def validate_config(c) -> None:
  """Reject bad values before any model is built (see module doc)."""
  from moejax.models import MODELS
  MODELS.get(c.model_name)
  validate_model(c.model)
  m = c.model
  if c.data.seq_len > m.max_seq_len:
    raise ConfigError(f"data.seq_len={c.data.seq_len} exceeds "
                      f"model.max_seq_len={m.max_seq_len}")
  _positive("data.seq_len", c.data.seq_len)
  _positive("data.batch_size", c.data.batch_size)
  if c.data.name == "mix":
    from moejax.data.mix import check_weights
    check_weights(c.data.mix.weights)
  if c.data.name == "files":
    from moejax.data.files import resolve_files
    resolve_files(c.data.files)
  if c.init.upcycle_from:
    from moejax.train.upcycle import source_config
    source_config(c)
  from moejax.layers.lookup import validate_l3
  validate_l3(c)
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
  sharding.validate_sharding_config(c)
  validate_micro_batches(c, fixed_batch_shards(c))


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
    raise choice_error("train.balance_statistics", c.train.balance_statistics,
                       BALANCE_STATISTICS)
  if batch % m:
    raise ConfigError(f"train.micro_batches={m} must divide data.batch_size={batch}")
  if batch_shards > 1 and (batch // batch_shards) % m:
    raise ConfigError(f"train.micro_batches={m} must divide the {batch // batch_shards} rows "
                      f"of each of the {batch_shards} batch shards (data.batch_size={batch}): "
                      "every micro-batch keeps rows on every shard")
  if m == 1:
    return
  if c.model.ffn_type == "moe":
    spec = routing.get_router(c.model.moe.router)
    if spec.init_state is not None and (c.model.scan_layers or c.model.remat != "none"):
      raise ConfigError(f"train.micro_batches={m} with model.scan_layers={c.model.scan_layers} "
                        f"and model.remat={c.model.remat!r}: the stateful router "
                        f"model.moe.router={c.model.moe.router!r} updates its state inside "
                        "the scanned or rematerialised block; use the loop without remat")
    routing.base.check_micro_batches(spec, c.model.moe, m)
    losses.check_step_statistics(c.model.moe.loss_weights, m, c.train.balance_statistics)


def validate_model(m) -> None:
  """The `model` section: every family, trained or imported (ConfigError names the key)."""
  for key in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "d_ff", "max_seq_len"):
    _positive(f"model.{key}", m[key])
  for key, value, choices in (("model.dtype", m.dtype, DTYPES),
                              ("model.ffn_type", m.ffn_type, FFN_TYPES),
                              ("model.attention.kind", m.attention.kind, ATTENTION_KINDS),
                              ("model.attention.qk_norm", m.attention.qk_norm, QK_NORMS),
                              ("model.rope.scaling", m.rope.scaling, ROPE_SCALINGS)):
    if value not in choices:
      raise choice_error(key, value, choices)
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(f"model.num_heads={m.num_heads} must be a multiple of "
                      f"model.num_kv_heads={m.num_kv_heads}")
  if m.head_dim % 2:
    raise ConfigError(f"model.head_dim={m.head_dim} must be even for RoPE")
  if len(m.attention.windows) not in (0, m.num_layers):
    raise ConfigError(f"model.attention.windows has {len(m.attention.windows)} entries "
                      f"for model.num_layers={m.num_layers} (give none or one per layer)")
  if m.ffn_type == "moe":
    validate_moe(m.moe, m.num_layers)
  counts = m.moe.expert_counts
  if counts and len(counts) != len(moe_layer_indices(m)):
    raise ConfigError(f"model.moe.expert_counts has {len(counts)} entries for "
                      f"{len(moe_layer_indices(m))} MoE layers")
  for i in range(len(counts)):
    spec = routing.get_router(m.moe.router)
    if spec.validate is not None:
      spec.validate(layer_moe_config(m, i))
  from moejax.models.decoder import REMAT_POLICIES, scan_layer_differences
  if m.remat not in REMAT_POLICIES:
    raise choice_error("model.remat", m.remat, REMAT_POLICIES)
  if m.scan_layers and scan_layer_differences(m):
    raise ConfigError(f"model.scan_layers=True needs identical layers; "
                      f"{scan_layer_differences(m)} (keep the loop: model.scan_layers=False)")


def moe_layer_indices(m) -> list[int]:
  """Sparse layers: i >= moe.first_dense with (i - first_dense) % every_n == 0 and i
  not in moe.dense_layers (none when model.ffn_type is 'dense')."""
  e = m.moe
  if m.ffn_type != "moe":
    return []
  return [i for i in range(m.num_layers) if i >= e.first_dense and i not in e.dense_layers
          and (i - e.first_dense) % e.every_n == 0]


def set_moe_layers(m, layers) -> None:
  """Make exactly `layers` sparse (ffn_type 'dense' when none): an HF config's
  list expressed in moe.first_dense / every_n / dense_layers. Works on a
  ConfigDict or a plain dict."""
  layers = sorted(layers)
  if not layers:
    m["ffn_type"] = "dense"
    return
  if m["ffn_type"] == "dense":
    m["ffn_type"] = "moe"
  first = layers[0]
  m["moe"]["first_dense"], m["moe"]["every_n"] = first, 1
  m["moe"]["dense_layers"] = [i for i in range(first, m["num_layers"]) if i not in layers]


def layer_windows(m) -> list[int]:
  """The sliding window of every layer (0 = full causal)."""
  return list(m.attention.windows) or [0] * m.num_layers


def layer_moe_config(m, moe_index: int) -> ml_collections.FrozenConfigDict:
  """The MoE section of the moe_index-th MoE layer, with its own expert count (pruned)."""
  moe = ml_collections.ConfigDict(m.moe.to_dict())
  if m.moe.expert_counts:
    moe.num_experts = m.moe.expert_counts[moe_index]
  return ml_collections.FrozenConfigDict(moe)


def expert_counts(m) -> list[int]:
  """Experts per MoE layer."""
  return list(m.moe.expert_counts) or [m.moe.num_experts] * len(moe_layer_indices(m))


def validate_placement(e, num_layers: int) -> None:
  """Which layers are sparse: model.moe.first_dense, every_n."""
  _positive("model.moe.every_n", e.every_n)
  if not 0 <= e.first_dense < num_layers:
    raise ConfigError(f"model.moe.first_dense={e.first_dense} must be in "
                      f"[0, model.num_layers={num_layers})")


def validate_moe(e, num_layers: int) -> None:
  if e.num_experts < 1:
    raise ConfigError(f"model.moe.num_experts={e.num_experts} must be >= 1 "
                      "(use model.ffn_type='dense' for a dense model)")
  if e.capacity_factor <= 0:
    raise ConfigError(f"model.moe.capacity_factor={e.capacity_factor} must be > 0")
  _positive("model.moe.expert_d_ff", e.expert_d_ff)
  validate_placement(e, num_layers)
  _positive("model.moe.dropless_tile", e.dropless_tile)
  _positive("model.moe.dropless_block", e.dropless_block)
  _positive("model.moe.dropless_min_block", e.get("dropless_min_block", 1))
  _positive("model.moe.min_capacity", e.min_capacity, strict=False)
  _positive("model.moe.num_shared_experts", e.num_shared_experts, strict=False)
  if e.num_shared_experts:
    _positive("model.moe.shared_d_ff", e.shared_d_ff)
  validate_part_settings(e)
  if not 0 <= e.router_jitter < 1:
    raise ConfigError(f"model.moe.router_jitter={e.router_jitter} must be in [0, 1)")
  spec = routing.get_router(e.router)
  if spec.validate is not None:
    spec.validate(e)
  if e.loss_weights and not spec.gives_probs:
    raise ConfigError(f"model.moe.loss_weights={dict(e.loss_weights)}: model.moe.router="
                      f"{e.router!r} forms no probabilities over all experts, so no loss "
                      "applies (set model.moe.loss_weights={})")
  dispatch.get_dispatcher(e.dispatch)
  validate_experts(e)
  for name, weight in e.loss_weights.items():
    losses.get_loss(name)
    _positive(f"model.moe.loss_weights.{name}", weight, strict=False)


def validate_experts(e) -> None:
  """model.moe.experts, every expert type's settings, and grouped_matmul with its own
  settings (gmm: gmm_backend), against the registries (moejax/experts,
  moejax/dispatch/grouped_matmul.py; no names are listed here)."""
  from moejax.dispatch.grouped_matmul import resolve_grouped_matmul
  expert_type = experts.get_expert_type(e.experts)  # settings: validate_part_settings
  matmul = resolve_grouped_matmul(e.grouped_matmul, expert_type.bind({}, e),
                                  config_key="model.moe.grouped_matmul")
  if matmul.fused and not expert_type.fused:
    raise ConfigError(f"model.moe.grouped_matmul={e.grouped_matmul!r} runs the expert type's "
                      f"fused path; model.moe.experts={e.experts!r} declares none")
  if matmul.validate is not None:
    matmul.validate(e)


# Dicts whose keys are data, not schema: a saved value replaces the default whole.
OPEN_DICTS = ("loss_weights", "weights")  # model.moe.loss_weights, data.mix.weights


def with_defaults(saved: dict) -> dict:
  """A config dict saved by an older moejax, with the keys added since at their
  defaults (new sections default to off), so its checkpoint still restores and
  compares equal to the config that made it."""
  def merge(default, value):
    out = dict(default)
    for key, v in value.items():
      nested = isinstance(v, dict) and isinstance(out.get(key), dict)
      out[key] = merge(out[key], v) if nested and key not in OPEN_DICTS else v
    return out
  return merge(base_config().to_dict(), migrate_part_settings(migrate_legacy(saved)))


def migrate_legacy(saved: dict) -> dict:
  """A saved config in today's schema: the one model schema (issue 12) moved
  model.rope_theta to model.rope.theta, and the decoder configs of converted
  workdirs said max_position for max_seq_len and listed moe_layers; OmniMoE
  became the one MoE layer with router product_key (migrate_omnimoe)."""
  model = dict(saved.get("model", {}))
  if model.get("ffn_type") == "omnimoe":
    model = migrate_omnimoe(model)
  model.pop("omni", None)  # every config held the section until the one MoE layer
  if "rope_theta" in model:
    model["rope"] = {**model.get("rope", {}), "theta": model.pop("rope_theta")}
  if "max_position" in model:
    model["max_seq_len"] = model.pop("max_position")
  if "moe_layers" in model:
    layers = model.pop("moe_layers")
    model["moe"] = dict(model.get("moe", {}))
    model.setdefault("ffn_type", "moe")
    set_moe_layers(model, layers)
  return {**saved, "model": model}


def migrate_omnimoe(model: dict) -> dict:
  """ffn_type 'omnimoe' with its model.omni section (before the one MoE layer) as
  the MoE layer with router product_key, atomic experts and one shared expert."""
  model = dict(model)
  omni = {**OMNI_DEFAULTS, **model.pop("omni", {})}
  fused = omni["schedule"] == "naive"  # the atomic type's fused path is that schedule
  model["ffn_type"] = "moe"
  model["moe"] = {**model.get("moe", {}), **dict(
      router="product_key", experts="atomic", num_experts=omni["num_atomic_experts"],
      top_k=omni["top_k"], product_key={"per_axis_k": omni["per_axis_k"]},
      atomic={"activation": omni["activation"]}, num_shared_experts=1,
      shared_d_ff=omni["shared_d_ff"], shared_expert_gate=False, loss_weights={},
      dispatch="dropless", grouped_matmul="fused" if fused else omni["grouped_matmul"],
      dropless_tile=omni["tile"], dropless_block=omni["block_rows"])}
  return model


# model.omni as the last moejax with it saved it (for migrate_omnimoe).
OMNI_DEFAULTS = dict(num_atomic_experts=4096, top_k=32, per_axis_k=0, shared_d_ff=448,
                     activation="silu", schedule="naive", grouped_matmul="tiled", tile=8,
                     block_rows=512)


def model_config_from_dict(saved_model: dict) -> ml_collections.ConfigDict:
  """The `model` section of a stored config (any moejax version) in today's schema."""
  return ml_collections.ConfigDict(with_defaults({"model": saved_model})["model"])


def migrate_part_settings(saved: dict) -> dict:
  """Flat model.moe keys of older configs moved into the sections of the parts
  that declare them (legacy_keys): probmoe_k_min -> probmoe.k_min, dpsl_alpha ->
  losses.dpsl.alpha."""
  moe = saved.get("model", {}).get("moe")
  if not isinstance(moe, dict):
    return saved
  for part in parts_with_settings():
    moe = part.migrate(moe)
  return {**saved, "model": {**saved["model"], "moe": moe}}


def flatten_config(d: dict, prefix: str = "") -> dict:
  """{'a': {'b': 1}} -> {'a.b': 1}; lists become tuples so values compare and hash."""
  out = {}
  for key, value in d.items():
    if isinstance(value, dict):
      out.update(flatten_config(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  return out


def parse_config_arg(arg: str | None, defaults: dict) -> ml_collections.ConfigDict:
  """Parse a big_vision-style config arg 'k1=v1,k2=v2' over `defaults`.

  Values are converted to the type of the default; unknown keys are refused.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in defaults:
      raise ConfigError(f"config arg {item!r} is not key=value with key in "
                        f"{sorted(defaults)}")
    kind = type(defaults[key])
    out[key] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
  return out


SIZES = {
    # name: (d_model, num_layers, num_heads, num_kv_heads, head_dim, expert_d_ff,
    #        seq_len, batch_size, steps)
    "tiny": (32, 2, 2, 1, 16, 32, 32, 8, 30),
    "small": (128, 4, 4, 2, 32, 256, 128, 32, 600),
}


def apply_size(c: ml_collections.ConfigDict, size: str) -> None:
  """Set model width/depth, data shape and steps from a named size."""
  if size not in SIZES:
    raise choice_error("config arg size", size, SIZES)
  (c.model.d_model, c.model.num_layers, c.model.num_heads, c.model.num_kv_heads,
   c.model.head_dim, c.model.moe.expert_d_ff, c.data.seq_len, c.data.batch_size,
   c.train.steps) = SIZES[size]
  c.model.moe.shared_d_ff = c.model.moe.expert_d_ff
  # The dense FFN has the active width of the MoE: top_k experts.
  c.model.d_ff = c.model.moe.top_k * c.model.moe.expert_d_ff
  if size == "tiny":
    c.train.warmup_steps, c.train.log_every, c.train.eval_every = 5, 10, 30
    c.train.checkpoint_every, c.train.eval_batches = 30, 2
