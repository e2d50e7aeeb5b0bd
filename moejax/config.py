"""The full config schema with defaults, and its validation.

Experiment files in configs/ start from `base_config()` and change what they
need, so every key exists and `--config.a.b=value` overrides always work.
`validate_config` runs before anything is built or compiled and raises a
ConfigError naming the bad key and value.
"""
import ml_collections

from moejax import dispatch, losses, routing
from moejax.errors import ConfigError, choice_error

FFN_TYPES = ("dense", "moe")
DTYPES = ("float32", "bfloat16")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 256
  m.d_model = 128
  m.num_layers = 4
  m.num_heads = 4
  m.num_kv_heads = 2
  m.head_dim = 32
  m.d_ff = 512  # dense FFN width (dense layers and the dense twin)
  m.max_seq_len = 1024
  m.rope_theta = 10000.0
  m.norm_eps = 1e-6
  m.dtype = "float32"  # compute dtype; parameters stay float32
  m.ffn_type = "moe"

  m.moe = e = ml_collections.ConfigDict()
  e.num_experts = 8
  e.top_k = 2
  e.expert_d_ff = 256  # fine-grained experts: independent of d_ff
  e.num_shared_experts = 0
  e.shared_d_ff = 256
  e.every_n = 1
  e.first_dense = 0
  e.router = "topk"
  e.renormalize = True
  e.router_jitter = 0.0
  e.router_init_scale = 0.1
  e.bias_update_rate = 1e-3
  e.routed_scaling_factor = 1.0
  e.dispatch = "dropless"
  e.grouped_matmul = "auto"  # dropless only: auto | tiled | ragged_dot | gmm
  e.dropless_tile = 128  # rows per expert tile in the dropless layout
  e.capacity_factor = 1.25
  e.min_capacity = 4
  e.loss_weights = ml_collections.ConfigDict({"load_balance": 1e-2, "z_loss": 1e-3})

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
  return c


def _positive(key, value, strict=True):
  if value < 0 or (strict and value == 0):
    raise ConfigError(f"{key}={value} must be {'> 0' if strict else '>= 0'}")


def validate_config(c) -> None:
  """Reject bad values before any model is built (see module doc)."""
  m = c.model
  for key in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "d_ff", "max_seq_len"):
    _positive(f"model.{key}", m[key])
  if m.dtype not in DTYPES:
    raise choice_error("model.dtype", m.dtype, DTYPES)
  if m.ffn_type not in FFN_TYPES:
    raise choice_error("model.ffn_type", m.ffn_type, FFN_TYPES)
  if m.num_heads % m.num_kv_heads:
    raise ConfigError(f"model.num_heads={m.num_heads} must be a multiple of "
                      f"model.num_kv_heads={m.num_kv_heads}")
  if m.head_dim % 2:
    raise ConfigError(f"model.head_dim={m.head_dim} must be even for RoPE")
  if c.data.seq_len > m.max_seq_len:
    raise ConfigError(f"data.seq_len={c.data.seq_len} exceeds "
                      f"model.max_seq_len={m.max_seq_len}")
  _positive("data.seq_len", c.data.seq_len)
  _positive("data.batch_size", c.data.batch_size)
  if m.ffn_type == "moe":
    validate_moe(m.moe, m.num_layers)
  t = c.train
  _positive("train.steps", t.steps)
  _positive("train.learning_rate", t.learning_rate)
  for key in ("log_every", "eval_every", "checkpoint_every", "max_to_keep"):
    _positive(f"train.{key}", t[key])
  _positive("train.warmup_steps", t.warmup_steps, strict=False)


def validate_moe(e, num_layers: int) -> None:
  if e.num_experts < 1:
    raise ConfigError(f"model.moe.num_experts={e.num_experts} must be >= 1 "
                      "(use model.ffn_type='dense' for a dense model)")
  if e.capacity_factor <= 0:
    raise ConfigError(f"model.moe.capacity_factor={e.capacity_factor} must be > 0")
  _positive("model.moe.expert_d_ff", e.expert_d_ff)
  _positive("model.moe.every_n", e.every_n)
  _positive("model.moe.dropless_tile", e.dropless_tile)
  _positive("model.moe.min_capacity", e.min_capacity, strict=False)
  _positive("model.moe.num_shared_experts", e.num_shared_experts, strict=False)
  if not 0 <= e.first_dense < num_layers:
    raise ConfigError(f"model.moe.first_dense={e.first_dense} must be in "
                      f"[0, model.num_layers={num_layers})")
  if not 0 <= e.router_jitter < 1:
    raise ConfigError(f"model.moe.router_jitter={e.router_jitter} must be in [0, 1)")
  spec = routing.get_router(e.router)
  if spec.validate is not None:
    spec.validate(e)
  dispatch.get_dispatcher(e.dispatch)
  from moejax.dispatch.dropless import get_grouped_matmul
  get_grouped_matmul(e.grouped_matmul)
  for name, weight in e.loss_weights.items():
    losses.get_loss(name)
    _positive(f"model.moe.loss_weights.{name}", weight, strict=False)


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
