r"""A tiny top-k MoE LM on polyglot-synth, the planted task with a known floor.

4 synthetic bigram languages, untagged 128-symbol documents (moejax/data/polyglot.py);
seq_len = doc_len, so every window is one document and its separator and the
Bayes floor is attainable. 2 layers, d_model 64, 8 SwiGLU experts of width 128,
top-2, dropless; evaluation every 50 steps on all 512 held-out documents.

  python -m experiments.train --config=configs/polyglot_synth.py --workdir=runs/polyglot
  python -m experiments.polyglot_report --workdir=runs/polyglot   # floor, excess, NMI

Args: the MoE args of configs/lm_shakespeare_moe.py (router=..., experts=..., top_k=...)
except size; e.g. --config=configs/polyglot_synth.py:router=expert_choice
"""

from moejax.configs import lm_shakespeare_moe


def get_config(arg=None):
  c = lm_shakespeare_moe.get_config(arg)
  m = c.model
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim = 64, 2, 2, 1, 32
  m.moe.expert_d_ff = m.moe.shared.d_ff = 128
  m.d_ff = m.moe.top_k * m.moe.expert_d_ff  # the dense twin's active width
  c.data.name = "polyglot_synth"
  c.data.seq_len = c.data.polyglot.doc_len
  c.data.batch_size = 32
  c.train.steps = 600
  c.train.eval_every = c.train.checkpoint_every = 50
  c.train.log_every = 25
  c.train.eval_batches = c.data.polyglot.eval_docs // c.data.batch_size  # every document
  return c
