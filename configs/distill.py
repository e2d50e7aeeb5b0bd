r"""Distil a zoo MoE teacher into a small dense student on the mix corpus
(task='distill', moejax/train/distill.py; residual KD: OpenReview Dh6KxUxG20).

  python -m experiments.zoo --models=s                # the teacher: runs/zoo/s
  python -m experiments.train --config=configs/distill.py --workdir=runs/distill/residual
  python -m experiments.train --config=configs/distill.py:method=kl --workdir=runs/distill/kl
  python -m experiments.train --config=configs/distill.py \
    --config.distill.teacher.hf_dir=DIR --config.distill.teacher.workdir=None ...

Args: method=residual|kl|hidden|none (none: the same student on cross-entropy alone,
task='lm'), teacher=<a training workdir> (default runs/zoo/s), steps=N.
Student: dense, d_model 64, 2 layers, SwiGLU width 256, 64 tokens x 16 rows a step
(the zoo's byte tokenizer, so teacher and student share the vocabulary).
"""

from moejax.config import base_config, parse_config_arg

DEFAULTS = dict(method="residual", teacher="runs/zoo/s", steps=300)


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = base_config()
  c.task = "lm" if a.method == "none" else "distill"
  if a.method != "none":
    c.distill.method = a.method
  c.distill.teacher.workdir = a.teacher
  m = c.model
  m.ffn_type = "dense"
  m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.d_ff = 64, 2, 2, 1, 32, 256
  c.data.name = "mix"
  c.data.seq_len, c.data.batch_size = 64, 16
  t = c.train
  t.steps, t.warmup_steps = a.steps, max(1, a.steps // 20)
  t.log_every, t.eval_every, t.eval_batches = 25, a.steps, 4
  t.checkpoint_every, t.max_to_keep = a.steps, 1
  return c
