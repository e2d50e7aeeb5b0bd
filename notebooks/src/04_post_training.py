# %% [markdown]
# # Post-training: prune and quantize, then measure what it cost
#
# Two post-training methods on a trained MoE, each writing a new training workdir
# that every tool reads like a trained run:
#
# * **expert pruning** (`moejax.posttrain.prune_workdir`): keep 6 of the 8 experts
#   in every MoE layer, chosen by SCHUR-A* (the subset whose outputs best
#   reconstruct the full layer's on calibration windows);
# * **quantization** (`moejax.posttrain.compress_workdir`): every expert weight in
#   4-bit codes (round-to-nearest, groups of 32 inputs), stored as the
#   `quantized` expert type.
#
# Then both are scored against the original on the same held-out documents, and
# the difference gets an interval from the study framework's statistics
# (`moejax/evaluation/stats.py`): the paired per-document bootstrap of the bpb
# difference, and a t-interval of the per-document bpb differences with its
# verdict words.
#
# The model: a checkout that holds the zoo's `xs` model (`runs/zoo/xs`, trained on
# the `mix` corpus by `python -m experiments.zoo --models=xs`) uses that one.
# Otherwise it is trained here: on a TPU or GPU the zoo's `xs` shape
# (`configs/zoo.py:model=xs`: d_model 64, 4 layers, 8 experts, 600 steps) on the
# embedded Shakespeare plays (the `mix` corpus needs its sources fetched first);
# on a CPU a tiny Shakespeare MoE (a minute).

# %% [setup]

# %%
from moejax.train.loop import train_and_evaluate

zoo_xs = os.path.join(REPO, "runs", "zoo", "xs")
if os.path.isdir(os.path.join(zoo_xs, "checkpoints")):
  source = zoo_xs
  print("using the zoo model", source)
else:
  if ACCELERATOR:
    from moejax.configs import zoo
    config = zoo.get_config("model=xs")
    config.data.name = "shakespeare"  # byte tokens, like mix; no sources to fetch
  else:
    from moejax.configs import lm_shakespeare_moe
    config = lm_shakespeare_moe.get_config("size=tiny")  # 8 experts of width 32, top-2
    config.train.steps = 80
  config.train.progress_bar = False
  source = os.path.join(WORK, "original")
  run = train_and_evaluate(config, source)
  print(f"trained {config.train.steps} steps: val bpb {run.eval['val_bpb']:.3f}")

# %% [markdown]
# ## Prune and quantize
#
# Both calibrate on windows of the model's own training split (16 here; the
# command lines default to 64: `python -m experiments.prune` and
# `python -m experiments.compress`).

# %%
from moejax.posttrain.compress_pipeline import Request
from moejax.posttrain.compress_workdir import compress_workdir
from moejax.posttrain.prune_workdir import prune_workdir

pruned = os.path.join(WORK, "pruned")
report = prune_workdir(source, pruned, keep="6", method="schur_astar", num_windows=16)
print("experts per MoE layer after pruning:", report["expert_counts"])
for layer in report["layers"]:
  print({k: v for k, v in layer.items() if k in ("block", "kept", "relative_error")})

quantized = os.path.join(WORK, "quantized")
report = compress_workdir(source, quantized, Request("uniform", 4, quantizer="rtn"),
                          num_windows=16, log=lambda *a: None)
print({k: v for k, v in report.items() if k in ("method", "level", "packed_bytes")})

# %% [markdown]
# ## Score the three models on the same documents
#
# The held-out split is cut into documents of about 1 KB (at line ends), so that
# the per-document statistics have many documents. `harness.evaluate` scores
# each document with every token seen in context windows of the training length
# and returns its summed negative log-likelihood (nats) and, per MoE layer, the
# experts of every scored token.

# %%
import numpy as np
from moejax.data.pipeline import split_documents
from moejax.evaluation import harness
from moejax.evaluation.model import DecoderLM
from moejax.train.load import load_model
from moejax.train.restore import restore

run_config = restore(source).config
text = "\n".join(t for _, t in split_documents(run_config.data))
documents, piece = [], ""
for line in text.splitlines(keepends=True):
  piece += line
  if len(piece) >= 1000:
    documents.append(("held-out", piece))
    piece = ""
documents = documents[:(96 if ACCELERATOR else 48)]
settings = harness.Settings(context=run_config.data.seq_len, probes=())

evaluations = {}
for name, workdir in {"original": source, "pruned 8 -> 6": pruned,
                      "4-bit RTN": quantized}.items():
  loaded, tokenizer, _ = load_model(workdir=workdir)
  lm = DecoderLM(loaded.config, loaded.params, loaded.rest)
  evaluations[name] = harness.evaluate(lm, tokenizer, tokenizer.eos_id, documents, settings)
  print(f"{name:14s} bpb {evaluations[name].report['bpb']['all']:.4f} on "
        f"{len(documents)} documents, {evaluations[name].report['bytes']} bytes")

# %% [markdown]
# ## Intervals and verdicts
#
# * `paired_bootstrap`: resample documents with replacement, score both models on
#   the same resample: the interval of bpb(method) - bpb(original) over the pooled
#   bytes.
# * `t_interval` of the per-document differences bpb_i(method) - bpb_i(original),
#   and `verdict` with the expected direction "higher" (removing experts or bits
#   should cost loss): **reproduces** when the whole 95% interval is above zero.

# %%
from IPython.display import Markdown, display
from moejax.evaluation import stats

original = evaluations["original"]
num_bytes = np.array([doc.num_bytes for doc in original.docs], np.float64)


def per_document_bpb(evaluation):
  return evaluation.scores.nats / np.log(2) / num_bytes


rows, differences = [], {}
for name, evaluation in evaluations.items():
  if name == "original":
    continue
  boot = stats.paired_bootstrap(evaluation.scores.nats, original.scores.nats, num_bytes,
                                num_resamples=2000, seed=0)
  differences[name] = per_document_bpb(evaluation) - per_document_bpb(original)
  interval = stats.t_interval(differences[name])
  rows.append([name, f"{evaluation.report['bpb']['all']:.4f}",
               f"{boot.difference:+.4f} [{boot.low:+.4f}, {boot.high:+.4f}]",
               stats.format_interval(interval),
               stats.verdict(interval, "higher", unit="documents")])
display(Markdown(f"original: **{original.report['bpb']['all']:.4f}** bpb, "
                 f"{len(num_bytes)} documents\n\n" + stats.markdown_table(
    ["model", "bpb", "bpb - original, paired bootstrap [95%]",
     "per-document difference: mean ± std [95% t]", "verdict (expect higher)"], rows)))

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.hist(list(differences.values()), bins=20, label=list(differences))
ax.axvline(0, color="k", lw=0.8)
ax.set(xlabel="bpb(method) - bpb(original), per document", ylabel="documents",
       title="what each document lost")
ax.legend()
fig.tight_layout()
display(fig)
plt.close(fig)
