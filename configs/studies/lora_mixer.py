r"""LoRA-Mixer (arXiv 2507.00029v2): does the Routing Specialization Loss raise the
mutual information between the LoRA experts and the tasks, compared with the
load-balance loss alone? (moejax/studies/scorers/lora_mixer.py)

  python -m experiments.study --config=configs/studies/lora_mixer.py
  python -m experiments.study --config=configs/studies/lora_mixer.py:tasks=mix   # mix domains

Draw d pretrains a dense base on polyglot-synth languages of data.polyglot.seed=1
(configs/polyglot_synth.py with a dense FFN, 64-symbol documents, batch 8, 150 steps,
seed d), then fine-tunes it 150 steps on four other languages (seed 0: the tasks) with
each arm's adapter on q/k/v/o, the base frozen (train.trainable='adapter',
configs/lora_mixer.py). Sized for a shared 2-core CPU (12 runs):
  rsl          LoRA-Mixer, 4 experts of rank 4, top-1, RSL at weight 0.01
  balance      the same with the load-balance loss at weight 0.01 instead
  single_lora  one LoRA of rank 16 (the mixer's LoRA parameters), no router loss
  ffn_rsl      rsl's experts on the dense FFN's gate/up/down instead (the MoE-LoRA
               baselines' place; more trainable parameters: d_ff = 4 d)
  ffn_rsl_rank2  the same at rank 2: about rsl's trainable parameter count
"""

import ml_collections

ADAPTER = "configs/lora_mixer.py:batch_size=8"
SHORT_DOCUMENTS = ("data.polyglot.doc_len=64", "data.seq_len=64")
ONE_EVALUATION = ("train.eval_every=150", "train.checkpoint_every=150", "train.eval_batches=8")


# tasks=mix: the base learns mix's drama and prose; the tasks are four other domains
MIX_BASE_DOMAINS = ("drama", "prose")
MIX_TASKS = ("arithmetic", "facts", "code", "speeches")


def mix_weights(domains) -> list[str]:
  """data.mix.weights overrides: weight 1 on `domains`, 0 on every other domain."""
  from moejax.data.mix import DOMAINS

  return [f"data.mix.weights.{d}={1.0 if d in domains else 0.0}" for d in DOMAINS]


def get_config(arg=None):
  from moejax.config import parse_config_arg

  a = parse_config_arg(arg, dict(tasks="polyglot"))
  if a.tasks not in ("polyglot", "mix"):
    from moejax.errors import choice_error

    raise choice_error("config arg tasks", a.tasks, ("polyglot", "mix"))
  c = ml_collections.ConfigDict()
  c.name = "lora_mixer"
  c.description = (
    "LoRA-Mixer: token-routed LoRA experts on a frozen base's attention projections "
    "(q, k, v, o; straight-through hard top-1 routing, our guess at the paper's hard-soft "
    "routing), trained with the Routing Specialization Loss (our guess at its form: "
    "E sum f P + mean token entropy - entropy of the mean routing, weights 1) or with the "
    "load-balance loss alone, a single LoRA with the mixer's LoRA parameter count, and "
    "the same RSL experts on the dense FFN's gate/up/down (ffn_rsl, the MoE-LoRA "
    "baselines' place; ffn_rsl_rank2 at rank 2, about the mixer's trainable parameters). "
    "Base: a dense 2-layer LM (d 64) pretrained 150 steps on four polyglot-synth languages "
    "(data.polyglot.seed=1, 64-symbol documents, batch 8); fine-tuning: 150 steps on four "
    "other languages (seed 0), the tasks, batch 8; scored on all 512 held-out documents "
    "(loss and accuracy per language). The paper claims RSL makes "
    "experts specialise; the small-scale check is I(task; top-1 expert) in bits, mean over "
    "the blocks and adapted projections. Draw d uses seed d for the base and every arm."
  )
  c.scorer = "lora_mixer"
  c.settings = {
    "workdir": "runs/lora_mixer",
    "steps": 150,
    "common": [*SHORT_DOCUMENTS, *ONE_EVALUATION],
    "base_config": "configs/polyglot_synth.py",
    "base_overrides": [
      "model.ffn_type=dense",
      "data.polyglot.seed=1",
      "data.batch_size=8",
      *SHORT_DOCUMENTS,
      *ONE_EVALUATION,
    ],
    "base_steps": 150,
    "num_tasks": 4,
  }
  c.arms = [
    {"name": "rsl", "config": f"{ADAPTER},loss=rsl", "overrides": []},
    {"name": "balance", "config": f"{ADAPTER},loss=balance", "overrides": []},
    {"name": "single_lora", "config": f"{ADAPTER},loss=none,experts=1,rank=16", "overrides": []},
    {"name": "ffn_rsl", "config": f"{ADAPTER},loss=rsl,place=ffn", "overrides": []},
    {"name": "ffn_rsl_rank2", "config": f"{ADAPTER},loss=rsl,place=ffn,rank=2", "overrides": []},
  ]
  if a.tasks == "mix":
    c.name = "lora_mixer_mix"
    c.description = c.description.replace(
      "Base: a dense 2-layer LM (d 64) pretrained 150 steps on four polyglot-synth languages "
      "(data.polyglot.seed=1, 64-symbol documents, batch 8); fine-tuning: 150 steps on four "
      "other languages (seed 0), the tasks, batch 8; scored on all 512 held-out documents "
      "(loss and accuracy per language).",
      "Base: a dense 2-layer LM (d 64) pretrained 300 steps on mix's drama and prose "
      "(64-token windows, batch 16); fine-tuning: 300 steps on four other domains of mix, "
      "the tasks (arithmetic, facts, code, speeches, equal weights), batch 8; scored on "
      "the first 8 KiB of each task's held-out documents (loss and accuracy per domain).",
    )
    c.settings.update(
      workdir="runs/lora_mixer_mix",
      steps=300,
      common=["data.name=mix", "data.seq_len=64", *mix_weights(MIX_TASKS), *ONE_EVALUATION],
      base_config="configs/distill.py:method=none",
      base_overrides=[*mix_weights(MIX_BASE_DOMAINS), *ONE_EVALUATION],
      base_steps=300,
      tasks=list(MIX_TASKS),
      heldout_bytes_per_domain=8192,
    )
  c.draws = 3
  c.reference = "balance"
  c.claims = [
    {
      "arm": "rsl",
      "reference": "balance",
      "metric": "mi_bits",
      "expect": "higher",
      "text": "RSL raises the expert-task mutual information over the load-balance loss",
    },
    {
      "arm": "rsl",
      "reference": "balance",
      "metric": "task_accuracy",
      "expect": "higher",
      "source": "ours",
      "text": "RSL's mean per-task accuracy is above the load-balance loss's",
    },
    {
      "arm": "rsl",
      "reference": "single_lora",
      "metric": "task_accuracy",
      "expect": "higher",
      "text": "LoRA-Mixer beats a single LoRA of the same LoRA parameter count",
    },
    {
      "arm": "rsl",
      "reference": "ffn_rsl",
      "metric": "task_accuracy",
      "expect": "higher",
      "text": "LoRA experts in the attention projections beat the same experts in the FFN, "
      "with fewer trainable parameters",
    },
    {
      "arm": "rsl",
      "reference": "ffn_rsl_rank2",
      "metric": "task_accuracy",
      "expect": "higher",
      "source": "ours",
      "text": "LoRA experts in the attention projections beat FFN experts of about the same "
      "trainable parameter count",
    },
  ]
  return c
