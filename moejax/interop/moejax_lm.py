"""A model trained here (moejax/models/transformer.py, `experiments.train` workdirs)
as a decoder of moejax/models/hf, so it generates with the KV cache and can be
exported (as Mixtral when its flags fit: softmax top-k, renormalised, every
layer MoE, no shared experts — the default Shakespeare MoE).

TransformerLM is the same pre-norm GQA + RoPE decoder with the same MoE
layer, and its parameter tree has the same paths, so the params carry over
unchanged; only the config is translated.
"""
import ml_collections

from moejax.errors import ConfigError
from moejax.interop.convert import Loaded, check_shapes
from moejax.models.hf.config import decoder_config, validate_decoder_config
from moejax.models.transformer import moe_layer_indices


def decoder_config_of(model_cfg) -> ml_collections.ConfigDict:
  """The decoder config computing what TransformerLM(model_cfg) computes."""
  src = model_cfg
  if src.get("ffn_type") == "omnimoe":
    raise ConfigError("model.ffn_type='omnimoe' has no KV-cache decoder in "
                      "moejax/models/hf yet; evaluate it with TransformerLM (train=False)")
  if src.get("l3") is not None and src.l3.enabled:
    raise ConfigError("model.l3.enabled=True: the KV-cache decoder in moejax/models/hf "
                      "has no L3 lookup layers yet; evaluate it with TransformerLM")
  m = decoder_config()
  m.family = "moejax"
  for key in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "d_ff", "norm_eps", "dtype"):
    m[key] = src[key]
  m.max_position = src.max_seq_len
  m.rope.theta = float(src.rope_theta)
  m.attention.windows = [0] * src.num_layers
  m.moe_layers = moe_layer_indices(src)
  for key, value in src.moe.to_dict().items():
    if key in m.moe:
      m.moe[key] = value
  m.moe.loss_weights = {}
  if m.moe.dispatch == "capacity":  # capacity drops depend on the batch: not causal
    m.moe.dispatch = "dropless"
  m.moe.dropless_tile = decoder_config().moe.dropless_tile
  validate_decoder_config(m)
  return m


def from_training_workdir(workdir: str, step: int | None = None):
  """(Loaded, tokenizer) of a TransformerLM checkpoint in a training workdir."""
  from moejax.inference.restore import load_from_workdir
  config, _, params, rest, tokenizer = load_from_workdir(workdir, step, for_generation=True)
  m = decoder_config_of(config.model)
  check_shapes(m, params, rest)
  return Loaded(m, params, rest), tokenizer
