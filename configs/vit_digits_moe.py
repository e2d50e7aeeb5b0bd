r"""A small ViT-MoE (V-MoE, Riquelme et al. 2021) classifying scikit-learn's 8x8 digits.

8x8x1 images in 2x2 patches (16 patches and a CLS token), 4 pre-norm blocks of
width 64 whose FFN is, in blocks 1 and 3 (every other block, as V-MoE), the one
MoE layer: 4 SwiGLU experts of width 64, top-2, dropless, Switch balance loss and
z-loss; the others a dense SwiGLU of width top_k * 64. Trains on the CPU in
about a minute:

  python -m experiments.train --config=configs/vit_digits_moe.py --workdir=runs/vit_moe

Variants by arg (comma-separated key=value):
  :moe=0              the dense arm: every FFN a SwiGLU of width top_k * expert width
  :experts=8,top_k=1  more experts, one per token
  :router=NAME        any registered router (moejax/routing)
  :pooling=mean       mean over patches instead of a CLS token
  :steps=100          shorter training
  :dataset=NAME       another image set of the vision kit (moejax/data/vision.py):
                      mnist (28x28), glyphs (20x20, 62 classes), textures (16x16),
                      in 4x4 patches; digits (the default) in 2x2
e.g. --config=configs/vit_digits_moe.py:moe=0
"""

from moejax.config import base_config, parse_config_arg
from moejax.data.vision import VISION_DATASETS
from moejax.errors import choice_error

DEFAULTS = dict(
  moe=True, experts=4, top_k=2, router="topk", pooling="cls", steps=400, dataset="digits"
)
EXPERT_D_FF = 64
PATCH_SIZE = {"digits": 2, "mnist": 4, "glyphs": 4, "textures": 4}


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = base_config()
  c.model_name = "vit"
  c.task = "classification"
  m = c.model
  if a.dataset not in PATCH_SIZE:
    raise choice_error("dataset", a.dataset, PATCH_SIZE)
  height, _, channels = VISION_DATASETS[a.dataset].image_shape
  m.vit.update(
    dict(
      image_size=height,
      patch_size=PATCH_SIZE[a.dataset],
      num_channels=channels,
      num_classes=VISION_DATASETS[a.dataset].num_classes,
      pooling=a.pooling,
    )
  )
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = 64, 4, 4, 4, 16
  m.ffn_type = "moe" if a.moe else "dense"
  m.moe.num_experts, m.moe.top_k, m.moe.router = a.experts, a.top_k, a.router
  m.moe.expert_d_ff = EXPERT_D_FF
  m.moe.first_dense, m.moe.every_n = 1, 2  # blocks 1 and 3
  m.d_ff = a.top_k * EXPERT_D_FF  # the dense FFN has the active width of the MoE
  c.data.name = a.dataset
  c.data.train_split, c.data.eval_split = "train", "test"
  c.data.batch_size = 64
  t = c.train
  t.steps, t.learning_rate, t.warmup_steps, t.weight_decay = a.steps, 3e-3, 20, 0.05
  t.log_every, t.eval_every, t.checkpoint_every = 50, 100, 200
  t.eval_batches = 16  # at most: digits' test split is 6 batches of 64, mnist's 32
  return c
