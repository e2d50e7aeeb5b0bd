# %% [markdown]
# # Routers side by side on polyglot-synth
#
# polyglot-synth (`configs/polyglot_synth.py`, `moejax/data/polyglot.py`) is a
# planted task: untagged documents in 4 synthetic bigram languages. Its best
# possible loss, the Bayes floor, is known exactly, and so is each token's
# language, so we can ask of a router: how close does the model get to the floor,
# how even is the load over the experts, and do the experts specialise by language
# (normalised mutual information between a token's language and its top-1 expert)?
#
# The router is one config key, `model.moe.router`; everything else stays the
# same. This notebook trains the same 2-layer, 8-expert, top-2 model with four
# routers:
#
# | router | what it does |
# |---|---|
# | `topk` | softmax over experts, keep the top k (Switch/GShard) + balance loss |
# | `sigmoid_bias` | sigmoid scores, a per-expert bias nudged towards balance, no aux loss (DeepSeek-V3) |
# | `smooth_topk` | a smoothed, differentiable top-k relaxation of the selection |
# | `capacity_aware` | top-k that reroutes tokens away from experts over capacity |
#
# On a CPU each run is short (150 steps, batch 16): the comparison shows the
# mechanics, not a verdict (`configs/studies/routers.py` runs the real study, over
# seeds, with intervals). On a TPU or GPU the runs are the config's full 600 steps.

# %% [setup]

# %%
from moejax.configs import polyglot_synth
from moejax.train.loop import train_and_evaluate

ROUTERS = ["topk", "sigmoid_bias", "smooth_topk", "capacity_aware"]


def router_config(router):
  c = polyglot_synth.get_config(f"router={router}")
  if not ACCELERATOR:
    c.train.steps, c.data.batch_size = 150, 16
    c.train.warmup_steps, c.train.log_every = 20, 10
    c.train.eval_every = c.train.checkpoint_every = 50
    c.train.eval_batches = 8  # 128 of the 512 held-out documents
  c.train.progress_bar = False
  return c


runs = {}
for router in ROUTERS:
  workdir = os.path.join(WORK, router)
  run = train_and_evaluate(router_config(router), workdir)
  runs[router] = workdir
  print(f"{router:15s} val bpb {run.eval['val_bpb']:.4f}  ({run.tokens_per_second:.0f} tokens/s)")

# %% [markdown]
# ## Loss against the floor, and load over training
#
# `run_report` (the library behind `experiments.polyglot_report`) computes the
# floor over exactly the evaluated tokens and the NMI of language vs top-1 expert
# per MoE layer. The load panel plots, per log step, the busiest expert's share of
# the routed slots over the mean share (1 = perfectly even), averaged over layers.

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from moejax.analysis.polyglot_floor import run_report
from moejax.train.metrics import expert_load_series, read_jsonl

reports = {router: run_report(workdir) for router, workdir in runs.items()}
floor = reports["topk"]["floor_bpb"]

fig, (ax_loss, ax_load) = plt.subplots(1, 2, figsize=(11, 3.6))
for router, workdir in runs.items():
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = [r for r in records if "val_bpb" in r]
  ax_loss.plot([r["step"] for r in evals], [r["val_bpb"] for r in evals], "o-", label=router)
  steps, load = expert_load_series(records)
  per_layer = [np.array(list(experts.values())) for experts in load.values()]  # [E, steps]
  ax_load.plot(steps, np.mean([f.max(0) / f.mean(0) for f in per_layer], 0), label=router)
ax_loss.axhline(floor, color="k", ls="--", lw=1, label="Bayes floor")
ax_loss.set(xlabel="step", ylabel="held-out bits per byte", title="loss")
ax_load.axhline(1, color="k", ls=":", lw=0.8)
ax_load.set(xlabel="step", ylabel="max / mean expert load", title="load balance")
ax_loss.legend()
fig.tight_layout()
display(fig)
plt.close(fig)

# %% [markdown]
# ## Summary table
#
# Tables go through `moejax/evaluation/stats.py` like every table of the studies.

# %%
from moejax.evaluation.stats import markdown_table
from IPython.display import Markdown


def last_load_ratio(workdir):
  steps, load = expert_load_series(read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  return np.mean([max(v[-1] for v in e.values()) * len(e) for e in load.values()])


rows = [[router, f"{r['val_bpb']:.4f}", f"{100 * r['excess']:+.1f}%",
         " / ".join(f"{v:.2f}" for v in r["nmi_language_top1_expert"]),
         f"{last_load_ratio(runs[router]):.2f}"] for router, r in reports.items()]
display(Markdown(f"Bayes floor: **{floor:.4f}** bits per byte over "
                 f"{reports['topk']['eval_windows']} held-out documents\n\n" + markdown_table(
    ["router", "val bpb", "excess over floor", "NMI(language; top-1 expert) per layer",
     "max/mean load (last step)"], rows)))

# %% [markdown]
# ## Which languages go to which experts
#
# For the last MoE layer: the share of each language's tokens whose top-1 expert
# is e (rows sum to 1). A router whose experts specialise shows a block pattern.

# %%
from moejax.data import polyglot
from moejax.data.pipeline import build_lm_data
from moejax.analysis.polyglot_floor import top1_experts
from moejax.evaluation.routing import domain_expert_counts, usage
from moejax.train.restore import load_from_workdir

fig, axes = plt.subplots(1, len(runs), figsize=(3.4 * len(runs), 2.8), squeeze=False)
for ax, (router, workdir) in zip(axes[0], runs.items()):
  config, graphdef, params, rest, _ = load_from_workdir(workdir)
  data = build_lm_data(config.data, seed=config.seed)
  windows = config.train.eval_batches * config.data.batch_size
  _, splits = polyglot.build(config.data)
  languages = polyglot.token_languages(splits["validation"][1], config.data.polyglot.doc_len,
                                       config.data.seq_len, windows).reshape(-1)
  experts = top1_experts(graphdef, params, rest, data.eval_batches(config.train.eval_batches))
  counts = domain_expert_counts(experts[-1][:, None], languages,
                                config.data.polyglot.num_languages, config.model.moe.num_experts)
  ax.imshow(usage(counts), vmin=0, vmax=1, cmap="viridis")
  ax.set(title=router, xlabel="top-1 expert", ylabel="language")
fig.tight_layout()
display(fig)
plt.close(fig)
