# %% [markdown]
# # moejax quick start: train, plot, sample
#
# A byte-level Mixture-of-Experts language model on the embedded Shakespeare plays
# (`configs/lm_shakespeare_moe.py`: 8 SwiGLU experts, top-2 routing, dropless
# dispatch, Switch balance loss + z-loss). On a CPU this notebook trains the `tiny`
# size for a few dozen steps (a minute or two); on a TPU or GPU it trains the
# default `small` size (600 steps). Then it plots the loss and each expert's share
# of the routed tokens from the run's `metrics.jsonl`, and samples text.

# %% [setup]

# %% [markdown]
# ## Train
#
# `get_config` takes the config file's `:arg` string; any key of the config can
# then be set in Python (on the command line: `--config.train.steps=...`).
# `train_and_evaluate` writes orbax checkpoints, TensorBoard events and
# `metrics.jsonl` into the workdir, and resumes from the latest checkpoint when
# called again with the same workdir.

# %%
from moejax.configs import lm_shakespeare_moe
from moejax.train.loop import train_and_evaluate

if ACCELERATOR:
  config = lm_shakespeare_moe.get_config("size=small")  # 600 steps, d_model 128, 4 layers
else:
  config = lm_shakespeare_moe.get_config("size=tiny")  # d_model 32, 2 layers
  config.train.steps = 60
config.train.log_every = 5
config.train.progress_bar = False
moe_cfg = config.model.moe
print(f"router {moe_cfg.router}, {moe_cfg.num_experts} experts of width {moe_cfg.expert_d_ff}, "
      f"top-{moe_cfg.top_k}, dispatch {moe_cfg.dispatch}, d_model {config.model.d_model}, "
      f"{config.model.num_layers} layers, {config.train.steps} steps")

workdir = os.path.join(WORK, "quickstart")
run = train_and_evaluate(config, workdir)
print(f"{config.train.steps} steps: held-out loss {run.eval['val_loss']:.3f} nats/token, "
      f"{run.eval['val_bpb']:.3f} bits per byte; {run.tokens_per_second:.0f} tokens/s")

# %% [markdown]
# ## Loss and expert load
#
# Every log step is one JSON line: the loss, the router losses, and per MoE layer
# `moe/layer<i>/load_fraction/e<j>`, the fraction of the batch's routed slots that
# went to expert j (1/8 each when balanced).

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from moejax.train.metrics import expert_load_series, read_jsonl

records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
steps = [r["step"] for r in records]
evals = [r for r in records if "val_loss" in r]
steps_load, load = expert_load_series(records)

fig, axes = plt.subplots(1, 1 + len(load), figsize=(4.5 * (1 + len(load)), 3.2))
axes[0].plot(steps, [r["loss"] for r in records], label="train")
axes[0].plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="held out")
axes[0].set(xlabel="step", ylabel="loss (nats/token)", title="loss")
axes[0].legend()
for ax, (layer, experts) in zip(axes[1:], load.items()):
  for name, values in experts.items():
    ax.plot(steps_load, values, lw=1, label=name)
  ax.axhline(1 / len(experts), color="k", ls=":", lw=0.8)
  ax.set(xlabel="step", ylabel="load fraction", title=f"{layer}: expert load")
axes[-1].legend(ncol=2, fontsize=7)
fig.tight_layout()
display(fig)
plt.close(fig)

last = records[-1]
for layer, experts in load.items():
  fractions = np.array([values[-1] for values in experts.values()])
  print(f"{layer}: last-step load max/mean {fractions.max() / fractions.mean():.2f}, "
        f"routing entropy {last[f'moe/{layer}/routing_entropy']:.3f}")

# %% [markdown]
# ## Sample
#
# `restore` reads the latest checkpoint with its config and tokenizer (bytes here);
# `generate` prefills the prompts in one call and decodes with a KV cache.

# %%
from moejax.inference.generate import generate
from moejax.train.restore import restore

ckpt = restore(workdir, for_generation=True)
prompts = ["ROMEO:", "JULIET:\nO "]
out = generate(ckpt.config.model, ckpt.params, ckpt.rest,
               [ckpt.tokenizer.encode(p) for p in prompts],
               max_new_tokens=64, temperature=0.8, top_k=40)
for row, prompt in enumerate(prompts):
  print(repr(prompt), "->", repr(ckpt.tokenizer.decode(out.row(row))))
print("distinct experts per decode step, per MoE layer (mean):",
      np.asarray(out.distinct_experts).mean(0).round(2))

# %% [markdown]
# ## One MoE layer alone
#
# The layer is a Flax NNX module: hidden states in, outputs and `aux` out (its
# weighted router loss, metrics and the routing: `expert_index`, `combine_weight`
# and `valid`, each [T, S] for T tokens and S slots).

# %%
import jax.numpy as jnp
from flax import nnx
from moejax.layers.moe import MoELayer

moe = MoELayer(32, config.model.moe, rngs=nnx.Rngs(0), dtype=jnp.float32)
y, aux = moe(jnp.ones((2, 16, 32)))
print("output", y.shape, "| expert_index", aux["expert_index"].shape,
      "| router loss", float(aux["aux_loss"]), "| metrics", sorted(aux["metrics"]))
print("experts of the first 4 tokens:\n", aux["expert_index"][:4])
