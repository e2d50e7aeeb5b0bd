"""A Vision Transformer classifier built from the decoder's blocks (config: moejax/config.py
`model`, `model.vit`).

ViT (Dosovitskiy et al. 2021, eq. 1-4): an image [H, W, C] is cut into N = (H/P)^2
patches of P x P pixels, each flattened and projected to d_model (eq. 1: x_p E, one
Linear, as a stride-P convolution is), a learned CLS token is prepended (or not:
pooling 'mean') and learned position embeddings E_pos are added; pre-norm blocks
follow (eq. 2-3), then a final norm, the pooled token (the CLS token's output, or
the mean over patches) and a linear head to num_classes logits (eq. 4).

The blocks are the decoder's own DecoderBlock (moejax/models/block.py): the one
attention module, here non-causal (every key slot allowed) and without rotary
embeddings (positions None: the learned E_pos carry the position), and the one FFN,
a dense SwiGLU or the one MoELayer with its routers, expert types, dispatchers,
losses and logical axes. Which blocks are MoE is the decoder's rule
(moejax/models/structure.py moe_layer_indices: model.ffn_type, model.moe.first_dense,
every_n, dense_layers); model.scan_layers and model.remat work as in the decoder.
V-MoE (Riquelme et al. 2021) is this model with MoE blocks.

Space-time (model.vit.frames = T > 1; ViViT's "spatio-temporal attention" model,
Arnab et al. 2021 sec. 3.3 with 1-frame tubelets): a video [T, H, W, C] is cut into
T * (H/P)^2 patches, frame-major, each embedded by the same Linear, with a learned
position embedding over space-time (one E_pos row per (frame, patch)); every block
attends over all of them, with the same blocks and the same MoE layer. frames = 1
(the default) is the image model: the same parameters, and a clip [B, 1, H, W, C]
gives what the image [B, H, W, C] does (tests/vision/test_vit_model.py). A prompt adapter
(model.vit.prompt, moejax/adapters/: VPT, VAPT) adds tokens after the CLS token, or
key/value prefixes to the blocks' attention (SMoPE).

    logits, aux, None = VisionTransformer(m)(images_BxHxWxC, train=False, rng=None)

logits: float32 [B, num_classes]; aux as the decoder's ({"aux_loss", "moe"}), so
the train step (moejax/train/step.py) adds the router losses the same way.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from moejax import sharding
from moejax.adapters import NO_ADAPTER, build_adapter, drop_prompts, place_prompts, validate_prompt
from moejax.adapters.base import attention_prefix
from moejax.config import VIT_POOLINGS
from moejax.errors import ConfigError, choice_error
from moejax.experts import merged
from moejax.layers.dense import Linear, RMSNorm
from moejax.models.block import REMAT_POLICIES, RESIDUAL_AXES, DecoderBlock, rematerialised
from moejax.models.decoder import DTYPES, gather_aux, is_moe_block
from moejax.models.scanned import ScannedBlocks

POSITION_INIT_STDDEV = 0.02  # ViT and BERT's initialisation of learned positions


def frames_of(v) -> int:
  """model.vit.frames (1, an image model, where a stored config predates the key)."""
  return v.get("frames", 1)


def num_patches(v) -> int:
  """Patches per image (per clip: every frame's) of the model.vit section `v`."""
  return frames_of(v) * (v.image_size // v.patch_size) ** 2


def num_tokens(m) -> int:
  """Tokens every block sees: the patches, plus the CLS token when pooling by it."""
  return num_patches(m.vit) + (m.vit.pooling == "cls")


def patchify(images_BxHxWxC, patch_size: int):
  """[B, H, W, C] -> [B, N, P*P*C]: row-major patches, each flattened as (row, col, C);
  a clip [B, T, H, W, C] -> [B, T*N, P*P*C], frame after frame."""
  if images_BxHxWxC.ndim == 5:
    b, t = images_BxHxWxC.shape[:2]
    x = patchify(images_BxHxWxC.reshape(b * t, *images_BxHxWxC.shape[2:]), patch_size)
    return x.reshape(b, t * x.shape[1], x.shape[2])
  b, h, w, c = images_BxHxWxC.shape
  p = patch_size
  x = images_BxHxWxC.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // p) * (w // p), p * p * c)


def validate_vit(c) -> None:
  """ConfigError naming the key for a model.vit setting (or a decoder key) the ViT cannot
  use with config `c` (moejax/validation.py calls it for model_name 'vit')."""
  m, v = c.model, c.model.vit
  for key in ("image_size", "patch_size", "num_channels", "num_classes", "frames"):
    value = frames_of(v) if key == "frames" else v[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"model.vit.{key}={value!r} must be an int >= 1")
  if v.image_size % v.patch_size:
    raise ConfigError(
      f"model.vit.patch_size={v.patch_size} must divide model.vit.image_size={v.image_size}"
    )
  if v.pooling not in VIT_POOLINGS:
    raise choice_error("model.vit.pooling", v.pooling, VIT_POOLINGS)
  if m.attention.windows:
    raise ConfigError(
      f"model.attention.windows={list(m.attention.windows)}: the ViT "
      "attends over every patch (give [])"
    )
  if c.task != "classification":
    raise ConfigError(
      f"task={c.task!r}: model_name='vit' classifies images (set task='classification')"
    )
  if frames_of(v) > 1 and v.prompt.adapter != NO_ADAPTER:
    raise ConfigError(
      f"model.vit.prompt.adapter={v.prompt.adapter!r}: prompts are for image models, "
      f"not model.vit.frames={frames_of(v)} (give 'none')"
    )
  validate_prompt(c)


class VisionTransformer(nnx.Module):
  """The ViT of the module doc; `m` is the `model` config section."""

  def __init__(self, m, *, rngs: nnx.Rngs):
    self.cfg = m
    v = m.vit
    self.dtype = DTYPES[m.dtype]
    self.patch_size = v.patch_size
    self.frames = frames_of(v)
    self.patch_embed = Linear(
      v.patch_size**2 * v.num_channels,
      m.d_model,
      rngs=rngs,
      dtype=self.dtype,
      logical_axes=(None, "embed"),
      bias=True,
    )
    self.cls_token = nnx.data(None)
    if v.pooling == "cls":
      self.cls_token = nnx.Param(
        jnp.zeros((1, 1, m.d_model), jnp.float32), logical_axes=(None, None, "embed")
      )
    self.position = nnx.Param(
      POSITION_INIT_STDDEV
      * jax.random.normal(rngs.params(), (num_tokens(m), m.d_model), jnp.float32),
      logical_axes=(None, "embed"),
    )
    self.blocks: ScannedBlocks | nnx.List[DecoderBlock]
    if m.scan_layers:
      self.blocks = ScannedBlocks(m, rngs=rngs, dtype=self.dtype)
    else:
      self.blocks = nnx.List(
        [DecoderBlock(m, i, rngs=rngs, dtype=self.dtype) for i in range(m.num_layers)]
      )
    self.final_norm = RMSNorm(m.d_model, m.norm_eps)
    self.head = Linear(
      m.d_model, v.num_classes, rngs=rngs, dtype=self.dtype, logical_axes=("embed", None), bias=True
    )
    self.prompt = nnx.data(build_adapter(m, rngs=rngs))  # model.vit.prompt: None or tokens

  def embed(self, images_BxHxWxC):
    """The blocks' input [B, L, d]: patch embeddings (after the CLS token) plus positions.
    Images [B, H, W, C] where model.vit.frames = 1, clips [B, T, H, W, C] (T = frames)."""
    clip = images_BxHxWxC.ndim == 5
    if (clip and images_BxHxWxC.shape[1] != self.frames) or (not clip and self.frames > 1):
      raise ValueError(
        f"inputs of shape {images_BxHxWxC.shape}: model.vit.frames={self.frames} takes "
        + (
          "[B, H, W, C] or [B, 1, H, W, C]" if self.frames == 1 else f"[B, {self.frames}, H, W, C]"
        )
      )
    x = self.patch_embed(patchify(images_BxHxWxC, self.patch_size))
    if self.cls_token is not None:
      cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (x.shape[0], 1, x.shape[2]))
      x = jnp.concatenate([cls, x], axis=1)
    return sharding.constrain(x + self.position[...].astype(x.dtype), RESIDUAL_AXES)

  def __call__(self, images_BxHxWxC, *, train: bool = False, rng=None, step_stats=None):
    """(logits [B, num_classes] float32, {"aux_loss", "moe"}, None); step_stats as the
    decoder's (one per MoE block: gradient accumulation, moejax/train/step.py)."""
    if rng is None:
      rng = jax.random.key(0)
    x = self.embed(images_BxHxWxC)
    prefix = int(self.cls_token is not None)  # prompt slots go after the CLS token
    if self.prompt is not None:
      x = place_prompts(self.prompt, 0, x, prefix)
    allowed = jnp.ones((1, 1, 1), bool)  # non-causal: every query sees every patch
    policy = REMAT_POLICIES[self.cfg.remat]
    adapter_losses: list = []  # the prefix hooks' weighted losses (SMoPE's router losses)
    if isinstance(self.blocks, ScannedBlocks):
      x, layers_aux = self.blocks(
        x, None, allowed, None, train=train, rng=rng, policy=policy, step_stats=step_stats
      )
    else:
      layers_aux = []
      moe_blocks = [i for i, block in enumerate(self.blocks) if block.is_moe]
      block_stats = dict(zip(moe_blocks, step_stats or ()))
      carry = None  # NAMEx's base expert (merged.pass_carry)
      for i, block in enumerate(self.blocks):
        if i > 0 and self.prompt is not None:
          x = place_prompts(self.prompt, i, x, prefix)
        call = block if policy is None else rematerialised(block, policy)
        hook = attention_prefix(self.prompt, i, train, adapter_losses)  # SMoPE's, or None
        x, aux, _ = call(
          x,
          None,
          allowed,
          None,
          None,
          0,
          train=train,
          rng=jax.random.fold_in(rng, i),
          step_stats=block_stats.get(i),
          carry=carry,
          **({} if hook is None else {"prefix": hook}),
        )
        aux, carry = merged.pass_carry(aux, carry)
        x = sharding.constrain(x, RESIDUAL_AXES)
        layers_aux.append(aux)
    model_aux = gather_aux(layers_aux, is_moe_block(self.blocks))
    if adapter_losses:
      model_aux["aux_loss"] = model_aux["aux_loss"] + sum(adapter_losses)
    if self.prompt is not None:
      x = drop_prompts(self.prompt, x, prefix)
    x = self.final_norm(x)
    pooled = x[:, 0] if self.cls_token is not None else jnp.mean(x, axis=1)
    logits = sharding.constrain(self.head(pooled).astype(jnp.float32), ("batch", None))
    return logits, model_aux, None
