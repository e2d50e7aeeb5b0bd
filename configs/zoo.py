r"""The checkpoint zoo: the models every post-training method starts from.

All train on the `mix` corpus (moejax/data/mix.py, byte tokens, default mixture
weights) and keep a snapshot at every 10% of training (so 10/30/60/100% are all
there); experiments/zoo.py trains, caches and evaluates them.

  name        d   layers  experts x width  top-k  active FFN  seq x batch  steps
  xs          64  4        8 x 128         2      256         128 x 16     600
  s           128 6       16 x 128         4      512         128 x 32     1200
  s_dense     128 6       dense 512        -      512         128 x 32     1200
  xs_dense    64  4       dense 256        -      256         128 x 16     600
  s_upcycled  s, started from s_dense's 30% snapshot (moejax/train/upcycle.py),
              trained for the remaining 70% of s's steps

s_dense and xs_dense have their MoE's active FFN width (top_k x expert width),
so the same active FLOPs per token. Sizes were fixed from a 50-step timing on this 2-core machine
(experiments/zoo.py --time_steps=50; README "Checkpoint zoo").

  python -m experiments.train --config=configs/zoo.py:model=xs --workdir=runs/zoo/xs

Args: model=xs|s|s_dense|xs_dense|s_upcycled, seed=N, and the MoE args of
configs/lm_shakespeare_moe.py (router=..., dispatch=...), so a sweep can vary
the router on a zoo model: configs/zoo.py:model=xs,router=probmoe.
"""

from moejax.config import parse_config_arg
from moejax.configs import lm_shakespeare_moe
from moejax.train.zoo import workdir_of

# name: (d_model, num_layers, num_heads, num_kv_heads, head_dim, experts, top_k,
#        expert_d_ff, seq_len, batch_size, steps)
SIZES = {
  "xs": (64, 4, 4, 2, 16, 8, 2, 128, 128, 16, 600),
  "s": (128, 6, 4, 2, 32, 16, 4, 128, 128, 32, 1200),
}
MODELS = ("xs", "s", "s_dense", "xs_dense", "s_upcycled")
UPCYCLE_SOURCE, UPCYCLE_AT = "s_dense", 0.3  # s_upcycled starts from s_dense's 30% snapshot
MOE_ARGS = {
  k: v for k, v in lm_shakespeare_moe.DEFAULTS.items() if k in ("router", "dispatch", "shared")
}


def size_of(model: str) -> str:
  """The SIZES row of `model`: its name before the first '_' (s_dense -> s)."""
  return model.split("_")[0]


def get_config(arg=None):
  a = parse_config_arg(arg, dict(model="xs", seed=0, **MOE_ARGS))
  if a.model not in MODELS:
    from moejax.errors import choice_error

    raise choice_error("config arg model", a.model, MODELS)
  (d, layers, heads, kv_heads, head_dim, experts, top_k, width, seq_len, batch, steps) = SIZES[
    size_of(a.model)
  ]
  c = lm_shakespeare_moe.get_config(
    f"router={a.router},dispatch={a.dispatch},shared={a.shared},experts={experts},top_k={top_k}"
  )
  c.seed = a.seed
  m = c.model
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = (
    d,
    layers,
    heads,
    kv_heads,
    head_dim,
  )
  m.moe.expert_d_ff = m.moe.shared.d_ff = width
  m.d_ff = top_k * width  # the dense twin's width: the MoE's active FFN width
  if a.model.endswith("_dense"):
    m.ffn_type = "dense"
  c.data.name = "mix"
  c.data.seq_len, c.data.batch_size = seq_len, batch
  if a.model == "s_upcycled":  # init.upcycle_from: set by experiments/zoo.py
    c.init.upcycle_step = int(steps * UPCYCLE_AT)
    steps -= c.init.upcycle_step
  t = c.train
  t.steps, t.warmup_steps = steps, steps // 20
  t.log_every, t.eval_every, t.eval_batches = 25, steps // 4, 16
  t.checkpoint_every, t.max_to_keep = steps // 10, 10  # every 10% snapshot kept
  t.progress_bar = False
  return c


def model_config(name: str, zoo_dir: str, seed: int = 0):
  """`name` at training seed `seed` (initialisation and data order); s_upcycled reads
  the snapshot of s_dense at the same seed in `zoo_dir` (the `config_of` of
  moejax/train/zoo.py)."""
  config = get_config(f"model={name},seed={seed}")
  if name == "s_upcycled":
    config.init.upcycle_from = workdir_of(UPCYCLE_SOURCE, zoo_dir, seed)
  return config
