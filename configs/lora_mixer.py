r"""LoRA-Mixer fine-tuning (arXiv 2507.00029v2; moejax/adapters/lora_mixer.py): a
pretrained model (HF safetensors or a converted workdir, init.hf_dir), kept frozen,
with token-routed LoRA experts on its attention projections trained on polyglot-synth
(four synthetic bigram languages, the tasks; moejax/data/polyglot.py).

  python -m experiments.train --config=configs/lora_mixer.py \
      --config.init.hf_dir=runs/base/converted --workdir=runs/lora_mixer
  python -m experiments.train --config=configs/lora_mixer.py:family=qwen3_moe,loss=balance \
      --config.init.hf_dir=/path/to/Qwen3-MoE --workdir=runs/qwen3_lora_mixer

The model section comes from the directory (moejax/train/init_from.py); this config
adds the adapter (model.attention.adapter='lora_mixer') and says how to train it:
train.trainable='adapter' (LoRAs and routers; the base is frozen) or 'adapter_router'
(the paper's second regime: routers only), and the router loss.
Args: family (the directory's), loss (rsl | balance | none), weight (its weight),
experts, top_k, rank, place (attention: q/k/v/o, the paper's; ffn: the dense SwiGLU's
gate/up/down, the MoE-LoRA baseline's place), trainable, steps, batch_size, languages
(data.polyglot.seed of the languages: another seed is another set of tasks).
"""

from moejax.config import base_config, parse_config_arg
from moejax.errors import choice_error

DEFAULTS = dict(
  family="moejax",
  loss="rsl",
  weight=0.01,
  experts=4,
  top_k=1,
  rank=4,
  place="attention",
  trainable="adapter",
  steps=300,
  batch_size=16,
  languages=0,
)
LOSSES = {"rsl": "rsl", "balance": "load_balance", "none": None}
PLACES = {"attention": "q,k,v,o", "ffn": "gate,up,down"}


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  if a.loss not in LOSSES:
    raise choice_error("config arg loss", a.loss, LOSSES)
  if a.place not in PLACES:
    raise choice_error("config arg place", a.place, PLACES)
  c = base_config()
  c.model.family = a.family
  c.init.requires_hf_dir = True
  c.model.attention.adapter = "lora_mixer"
  s = c.model.attention.lora_mixer
  s.num_experts, s.top_k, s.rank = a.experts, a.top_k, a.rank
  s.projections = PLACES[a.place]
  s.loss_weights = {} if LOSSES[a.loss] is None else {LOSSES[a.loss]: a.weight}
  c.model.moe.loss_weights = {}  # a frozen MoE base's own router losses would only move the LoRAs
  c.train.trainable = a.trainable
  c.data.name = "polyglot_synth"
  c.data.polyglot.seed = a.languages
  c.data.seq_len = c.data.polyglot.doc_len  # one document (and its separator) per window
  c.data.batch_size = a.batch_size
  t = c.train
  t.steps, t.learning_rate, t.warmup_steps = a.steps, 3e-3, min(20, a.steps // 10)
  t.weight_decay = 0.0
  t.log_every = t.eval_every = t.checkpoint_every = max(1, min(50, a.steps // 3))
  t.eval_batches = c.data.polyglot.eval_docs // a.batch_size  # every held-out document
  return c
