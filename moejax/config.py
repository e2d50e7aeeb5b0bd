"""The full config schema with defaults.

Experiment files in configs/ start from `base_config()` and change what they
need, so every key exists and `--config.a.b=value` overrides always work.
`moejax.validation.validate_config` runs before anything is built or compiled and
raises a ConfigError naming the bad key and value; the layer structure a config
describes is read by moejax/models/structure.py, and configs saved by older moejax
are upgraded by moejax/migrate.py.
"""

import ml_collections

from moejax import adapters, dispatch, experts, losses, routing, sharding
from moejax.experts import merged
from moejax.layers import moe as moe_layer
from moejax.errors import ConfigError, choice_error
from moejax.registry import PartSettings

FFN_TYPES = ("dense", "moe")
DTYPES = ("float32", "bfloat16")
ATTENTION_KINDS = ("gqa", "mla")
QK_NORMS = ("none", "per_head", "across_heads")
ROPE_SCALINGS = ("default", "yarn")
BALANCE_STATISTICS = ("step", "micro_batch")  # train.balance_statistics
TRAINABLE = ("all", "router", "prompt", "head", "adapter", "adapter_router")  # train.trainable
TASKS = ("lm", "classification", "distill")  # task (moejax/train/tasks.py)
VIT_POOLINGS = ("cls", "mean")  # model.vit.pooling


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model_name = "decoder"  # a registered model (moejax.models.MODELS)
  # What the train loop optimises: 'lm' (next-token cross-entropy, val_bpb),
  # 'classification' (an image dataset of moejax/data/vision.py: cross-entropy, accuracy)
  # or 'distill' (lm plus a term from a frozen teacher, the `distill` section below).
  c.task = "lm"

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
  # The scale skeleton (moejax/models/scanned.py): identical layers built by nnx.vmap
  # and run by nnx.scan (one block traced and compiled, not num_layers), and
  # rematerialisation by a named policy: none | full | dots | save_moe_routing
  # (keep the routing, recompute experts).
  m.scan_layers = False
  m.remat = "none"
  # Rotary embeddings (moejax/layers/rope.py): 'default' or 'yarn' frequencies;
  # interleave pairs 2i with 2i+1 (DeepSeek) instead of rotate-half.
  m.rope = ml_collections.ConfigDict(
    dict(
      theta=10000.0,
      scaling="default",
      interleave=False,
      factor=1.0,
      original_max_position=4096,
      beta_fast=32.0,
      beta_slow=1.0,
      mscale=0.0,
      mscale_all_dim=0.0,
      attention_factor=0.0,
      truncate=True,
    )
  )
  # Attention (moejax/layers/attention.py): 'gqa' or 'mla' (DeepSeek latent);
  # qk_norm none | per_head (Qwen3) | across_heads (OLMoE); clip_qkv 0 = off;
  # windows: per-layer sliding window, [] or 0 = full causal.
  m.attention = ml_collections.ConfigDict(
    dict(kind="gqa", qkv_bias=False, out_bias=False, qk_norm="none", clip_qkv=0.0, windows=[])
  )
  m.attention.mla = ml_collections.ConfigDict(
    dict(q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0)
  )
  # An attention projection adapter (moejax/adapters/projection.py): 'none' or a
  # registered one (lora_mixer), its settings in model.attention.<name>.
  adapters.projection.add_adapter_sections(m.attention)

  # The MoE layer. A key stays flat here only where no one section owns it: the
  # layer's shape and placement, the names that choose its parts, and the loss
  # weights. Each part's own settings are in its section, and so are the routing keys
  # that more than one router or the layer reads (model.moe.routing; add_part_sections,
  # below).
  m.moe = e = ml_collections.ConfigDict()
  e.num_experts = 8  # flat: the layer's shape, read by every part
  e.top_k = 2  # flat: the layer's shape (slots per token), read by routers and dispatch
  e.expert_d_ff = 256  # flat: the layer's shape; fine-grained experts: independent of d_ff
  e.every_n = 1  # flat: placement of the MoE layers (moejax/models/structure.py)
  e.first_dense = 0  # flat: placement, as every_n
  e.dense_layers = []  # flat: placement; further layers kept dense (HF mlp_only_layers)
  # flat: the model's per-layer shape after pruning ([] = num_experts everywhere)
  e.expert_counts = []
  # flat: chooses the router (its settings: model.moe.<router>; the routing keys
  # routers share: model.moe.routing).
  e.router = "topk"
  # flat: chooses the expert type (swiglu | atomic); its own settings: model.moe.<type>.
  e.experts = "swiglu"
  # flat: chooses the dispatcher (its settings: model.moe.dropless, model.moe.capacity).
  e.dispatch = "dropless"
  # flat, chooses: none | smear | ep_camex | namex: merge expert parameters per segment
  # instead of dispatching tokens (moejax/experts/merged.py; settings in model.moe.merged).
  e.merge = "none"
  # flat, chooses: dropless only, moejax/dispatch/grouped_matmul.py: auto | fused | loop |
  # tiled | ragged_dot | gmm (gmm's settings: model.moe.gmm).
  e.grouped_matmul = "auto"
  # flat: a table of weights, one per chosen loss (an open dict: its keys are loss
  # names); each loss's own settings: model.moe.losses.<loss>.
  e.loss_weights = ml_collections.ConfigDict({"load_balance": 1e-2, "z_loss": 1e-3})
  # Each part's own settings are in its section, added here from the registries at
  # the defaults the part declares: the routing keys that routers and the layer
  # share, model.moe.routing (renormalize, routed_scaling_factor, bias_update_rate,
  # num_groups, topk_groups, jitter, init_scale; moejax/routing/base.py); a router's
  # or expert type's, model.moe.<name> (model.moe.sere.rho,
  # model.moe.atomic.activation); a loss's, model.moe.losses.<loss>
  # (model.moe.losses.dpsl.alpha); a dispatcher's or grouped matmul's
  # (model.moe.dropless.tile, model.moe.capacity.factor, model.moe.gmm.backend); the
  # shared expert's, model.moe.shared (count, d_ff, gate); see moejax/registry.py.
  add_part_sections(e)

  # L3 Large Lookup Layers (moejax/layers/lookup.py): static token-id routing to
  # a CSR table of `budget` rows, <= cap per token id, one L3 layer at the end of
  # each block in `layers`; rows allocated by `allocation` from `corpus`'s train
  # split (moejax/data/l3_allocation.py, passed to the model).
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

  # model_name="vit" (moejax/models/vit.py) reads the keys above (width, depth,
  # heads, ffn_type and the moe section, attention; not rope, vocab or windows)
  # and these: square images of image_size pixels cut into patch_size patches,
  # pooled by the CLS token or the mean over patches into num_classes logits;
  # frames > 1: clips of that many frames, patches across space-time (1: images).
  m.vit = ml_collections.ConfigDict(
    dict(image_size=8, patch_size=2, num_channels=1, num_classes=10, pooling="cls", frames=1)
  )
  # Prompt tuning (moejax/adapters/): adapter 'none' or a registered one (vpt_shallow,
  # vpt_deep, vapt) with num_tokens prompt slots after the CLS token; an adapter's own
  # settings in model.vit.prompt.<name>, defaults declared in its file.
  m.vit.prompt = ml_collections.ConfigDict(dict(adapter=adapters.NO_ADAPTER, num_tokens=4))
  for name, spec in adapters.ADAPTERS.items():
    if spec.settings:
      m.vit.prompt[name] = ml_collections.ConfigDict(dict(spec.settings))

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
  d.mix = ml_collections.ConfigDict(
    dict(
      weights=ml_collections.ConfigDict(
        dict(drama=1.0, prose=1.0, speeches=1.0, code=1.0, facts=0.5, arithmetic=0.5)
      )
    )
  )
  # data.name=polyglot_synth: the planted task's settings; the defaults
  # are moejax.data.polyglot.DEFAULTS (a test keeps the two equal).
  d.polyglot = ml_collections.ConfigDict(
    dict(
      num_languages=4,
      pool_size=24,
      alphabet_size=12,
      branching=3,
      doc_len=128,
      train_docs=4096,
      eval_docs=512,
      seed=0,
    )
  )
  # data.name="files" (moejax/data/files.py): globs of .txt / .jsonl files (.jsonl:
  # one document per line, under text_key), streamed from disk. eval unset: every
  # 10th train file (sorted) is held out whole.
  d.files = ml_collections.ConfigDict(
    dict(
      train=ml_collections.config_dict.placeholder(str),
      eval=ml_collections.config_dict.placeholder(str),
    )
  )

  # Start from pretrained weights (moejax/train/init_from.py): an HF checkpoint
  # directory or a converted workdir. The model section then comes from it
  # (model.family must name its family); the MoE training keys stay the config's.
  c.init = ml_collections.ConfigDict()
  c.init.hf_dir = ml_collections.config_dict.placeholder(str)
  # A fine-tuning recipe (configs/finetune_hf.py) sets this: training refuses to
  # start from scratch when no init.hf_dir is given.
  c.init.requires_hf_dir = False
  # Sparse upcycling (moejax/train/upcycle.py): an MoE started from a dense training
  # workdir's checkpoint (upcycle_step; 0 = its latest), experts cut from its FFNs.
  c.init.upcycle_from = ml_collections.config_dict.placeholder(str)
  c.init.upcycle_step = 0

  # task='distill' (moejax/train/distill.py): the method ('kl' | 'residual'), its
  # weight and temperature; the teacher (one of workdir, hf_dir); vocab_map ('none' |
  # 'shared_prefix'); residual KD's stage-1 projector fit; a misleading teacher for
  # studies: its logits permuted on rows of these comma-separated mix domains.
  c.distill = ml_collections.ConfigDict(
    dict(
      method="residual",
      weight=1.0,
      temperature=1.0,
      teacher=dict(
        workdir=ml_collections.config_dict.placeholder(str),
        hf_dir=ml_collections.config_dict.placeholder(str),
      ),
      vocab_map="none",
      projector_steps=50,
      projector_learning_rate=3e-3,
      corrupt_domains="",
      corrupt_seed=0,
    )
  )

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
  # fine-tuning of a quantized model, moejax/posttrain/compress_pipeline.py), or for
  # the ViT 'prompt' (the prompt adapter and the head) or 'head' (a linear probe), or
  # 'adapter' (the attention adapter: LoRA-Mixer's LoRAs and routers) or
  # 'adapter_router' (only the adapter's routers).
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
  """The settings section of every registered router, expert type, loss, dispatcher
  and grouped matmul that declares settings, of the routing keys routers share, of
  merged experts and of the shared expert (moejax/registry.py, PartSettings); a
  section that parts share, once."""
  sections = [
    spec.config_section
    for registry in (routing.ROUTERS, experts.EXPERT_TYPES, losses.LOSSES)
    for _, spec in registry.items()
    if spec.settings
  ] + [
    spec.settings
    for registry in (dispatch.DISPATCHERS, dispatch.GROUPED_MATMULS)
    for _, spec in registry.items()
    if spec.settings is not None
  ]
  out: dict[str, PartSettings] = {}
  for part in [routing.ROUTING, *sections, merged.SETTINGS, moe_layer.SHARED]:
    if out.setdefault(part.path, part) is not part:
      raise ValueError(f"model.moe.{part.path}: declared by {out[part.path].what} and {part.what}")
  return list(out.values())


def moved_key(key: str) -> str | None:
  """The key a flat model.moe key of older configs moved to (a part's legacy_keys:
  model.moe.dropless_tile -> model.moe.dropless.tile), or None for any other key."""
  prefix = "model.moe."
  for part in parts_with_settings() if key.startswith(prefix) else ():
    for old, new in part.legacy_keys:
      if key == prefix + old:
        return f"{prefix}{part.path}.{new}"
  return None


def add_part_sections(e) -> None:
  """model.moe.<part> and model.moe.losses.<loss>: every part's declared defaults."""
  for part in parts_with_settings():
    part.add_defaults(e)


def parse_config_arg(arg: str | None, defaults: dict) -> ml_collections.ConfigDict:
  """Parse a big_vision-style config arg 'k1=v1,k2=v2' over `defaults`.

  Values are converted to the type of the default; unknown keys are refused.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in defaults:
      raise ConfigError(f"config arg {item!r} is not key=value with key in {sorted(defaults)}")
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
  (
    c.model.d_model,
    c.model.num_layers,
    c.model.num_heads,
    c.model.num_kv_heads,
    c.model.head_dim,
    c.model.moe.expert_d_ff,
    c.data.seq_len,
    c.data.batch_size,
    c.train.steps,
  ) = SIZES[size]
  c.model.moe.shared.d_ff = c.model.moe.expert_d_ff
  # The dense FFN has the active width of the MoE: top_k experts.
  c.model.d_ff = c.model.moe.top_k * c.model.moe.expert_d_ff
  if size == "tiny":
    c.train.warmup_steps, c.train.log_every, c.train.eval_every = 5, 10, 30
    c.train.checkpoint_every, c.train.eval_batches = 30, 2
