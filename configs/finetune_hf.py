r"""Fine-tune a pretrained MoE (HF safetensors or a converted workdir) on the
embedded Shakespeare plays, byte tokens (the model's vocabulary must hold 256
ids; a real checkpoint's own tokenizer is not used here).

  python -m experiments.train --config=configs/finetune_hf.py:family=qwen3_moe \
      --config.init.hf_dir=/path/to/Qwen3-MoE --workdir=runs/qwen3_ft

The model section comes from the directory (moejax/train/init_from.py); the
config names the family it expects and says how to train: router losses,
the learning rate (a fine-tuning 3e-4 with a short warmup) and the data.
Args: family (mixtral | qwen2_moe | qwen3_moe | olmoe | deepseek_v3 | moejax),
steps, seq_len, batch_size.
"""

from moejax.config import base_config, parse_config_arg

DEFAULTS = dict(family="qwen3_moe", steps=200, seq_len=64, batch_size=8)


def get_config(arg=None):
  a = parse_config_arg(arg, DEFAULTS)
  c = base_config()
  c.model.family = a.family
  c.init.requires_hf_dir = True
  c.model.moe.loss_weights = {"load_balance": 1e-2}
  c.data.seq_len, c.data.batch_size = a.seq_len, a.batch_size
  t = c.train
  t.steps, t.learning_rate, t.warmup_steps = a.steps, 3e-4, min(20, a.steps // 10)
  t.log_every = t.eval_every = t.checkpoint_every = max(1, min(50, a.steps // 3))
  t.eval_batches = 4
  return c
