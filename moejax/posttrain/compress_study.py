"""A compression study on a trained workdir (issue 15): each arm of a table at each
level on several calibration draws, scored by the evaluation harness on the
same held-out bytes, with paired intervals over the draws.

Tables (`TABLES`): 'gemq' (quantized experts, GPTQ, average bits), 'codequant'
(codebooks against per-group RTN at the same bit allocation), 'td_moe' (fraction
of expert parameters removed). Draw d draws calibration windows with seed d
(prune.calibration_windows) shared by every arm; an arm whose model does not
depend on the draw (per-expert SVD, plain Tucker, uniform RTN) is built and
scored once and counted on every draw. Each arm is scored from the
float model that equals its compressed one (compress_pipeline: dequantized /
reconstructed experts, fine-tuned routers): bpb per domain, probes, and the
fraction of (token, MoE layer) pairs whose top-k expert set differs from the
uncompressed model's on held-out windows ('re-routed'). On the first draw each
arm with an expert type is also built, saved as a training workdir in a scratch
directory and measured: its experts' packed bytes and the checkpoint's bytes on
disk (codes are held one per uint8 byte there).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moejax.posttrain import compress_pipeline as cp
from moejax.posttrain import compress_workdir as cw
from moejax.posttrain import prune


@dataclasses.dataclass(frozen=True)
class Arm:
  """One compressed model of a table: method, quantizer, rounds, fine-tuning."""
  name: str
  method: str
  quantizer: str = "gptq"
  rounds: int = 1
  finetune: bool = False
  damping: float = 1e-6          # whitening damping (TD-MoE, whitened SVD)
  integer_only: bool = False     # only at integer levels (uniform bits)
  fractional_only: bool = False  # only at fractional levels

  @property
  def calibration_free(self) -> bool:
    """Its model does not depend on the calibration draw (nor on the seed)."""
    return self.method in ("svd", "tucker") or (self.method == "uniform"
                                                and self.quantizer == "rtn")

  def applies(self, level: float) -> bool:
    integer = level == int(level)
    return not ((self.integer_only and not integer) or (self.fractional_only and integer))


TABLES = {
    "gemq": (Arm("uniform", "uniform", integer_only=True), Arm("per_layer", "per_layer"),
             Arm("gemq", "gemq"), Arm("gemq_ft", "gemq", finetune=True),
             Arm("gemq_progressive", "gemq", rounds=2, finetune=True, fractional_only=True)),
    "codequant": (Arm("rtn", "uniform", "rtn", integer_only=True),
                  Arm("rtn", "gemq", "rtn", fractional_only=True),
                  Arm("kmeans", "kmeans"), Arm("codequant", "codequant")),
    "td_moe": (Arm("svd", "svd"), Arm("whitened_svd", "whitened_svd"),
               Arm("tucker", "tucker"), Arm("td_moe", "td_moe"),
               # not the paper's: whitening damped like GPTQ's 1% (an ablation, chosen
               # after td_moe starved layer 0's input mode at damping 1e-6)
               Arm("td_moe_damped", "td_moe", damping=0.01)),
}
REFERENCE = {"gemq": "per_layer", "codequant": "rtn", "td_moe": "svd"}
CLAIMS = {
    "gemq": (("gemq", "per_layer", "lower", "GEMQ: the global allocation beats per-layer"),
             ("gemq", "uniform", "lower", "GEMQ: mixed precision beats uniform bits"),
             ("gemq_ft", "gemq", "lower", "GEMQ: router fine-tuning lowers bpb"),
             ("gemq_progressive", "gemq_ft", "lower",
              "GEMQ: the progressive loop beats one round")),
    "codequant": (("codequant", "rtn", "lower", "CodeQuant beats per-group RTN"),
                  ("codequant", "kmeans", "lower", "CodeQuant: rotation + fine-tuning beat "
                   "plain k-means"),
                  ("kmeans", "rtn", None, "k-means codebooks against RTN")),
    "td_moe": (("td_moe", "svd", "lower", "TD-MoE beats per-expert SVD"),
               ("td_moe", "whitened_svd", "lower", "TD-MoE beats whitened per-expert SVD"),
               ("td_moe", "tucker", "lower", "TD-MoE: whitening beats plain joint Tucker"),
               ("td_moe_damped", "td_moe", None, "ablation: whitening damped 1% vs 1e-6")),
}
# Codebooks store far less beside their codes than per-group RTN (a float32 scale and
# a zero point per group and output column, 1.25 extra bits per weight at group 32):
# the pairs of (arm, level) whose packed expert bytes are about equal.
EQUAL_BYTES = {"codequant": ((("codequant", "4.0"), ("rtn", "3.0")),
                             (("kmeans", "4.0"), ("rtn", "3.0")),
                             (("codequant", "3.0"), ("rtn", "2.5")),
                             (("kmeans", "3.0"), ("rtn", "2.5")))}
REROUTE_CLAIMS = {"gemq": (("gemq_ft", "gemq", "lower",
                            "GEMQ: router fine-tuning re-routes fewer tokens"),)}
MATCHED_REROUTE_CLAIMS = {"gemq": (("gemq_ft", "gemq", "lower",
                                    "GEMQ: router fine-tuning re-routes fewer tokens, each "
                                    "against the fp32 model with the same router training"),)}


def request(table: str, arm: Arm, level: float, seed: int, group_size: int) -> cp.Request:
  choices = cp.DEFAULT_BIT_CHOICES
  if table == "codequant" and level != int(level):  # the codebooks' allocation (2, 3)
    choices = cp.bit_choices_for(cp.Request("kmeans", level))
  return cp.Request(arm.method, level, quantizer=arm.quantizer, group_size=group_size,
                    bit_choices=choices, seed=seed, damping=arm.damping)


@functools.partial(jax.jit, static_argnums=0)
def _top_k_sets(graphdef, params, rest, tokens):
  from moejax.analysis.router_inference import captured_forward
  model = nnx.merge(graphdef, params, rest)
  _, aux, _ = captured_forward(model, tokens)
  e = model.cfg.moe.num_experts
  out = []
  for layer in aux["moe"]:
    index = layer["expert_index"].reshape(-1, layer["expert_index"].shape[-1])
    valid = layer["valid"].reshape(index.shape)
    out.append(jnp.zeros((index.shape[0], e + 1), bool).at[
        jnp.arange(index.shape[0])[:, None], jnp.where(valid, index, e)].set(True)[:, :e])
  return jnp.stack(out, axis=1)


def routing_sets(graphdef, params, rest, batches) -> np.ndarray:
  """bool [tokens, MoE layers, E]: each token's top-k expert set in every MoE layer
  (one compiled program per model config, whatever the parameters)."""
  return np.concatenate([np.asarray(_top_k_sets(graphdef, params, rest, jnp.asarray(b)))
                         for b in batches])


def rerouted(reference_sets: np.ndarray, sets: np.ndarray) -> float:
  """Fraction of (token, MoE layer) pairs whose top-k expert set changed."""
  return float(np.mean(np.any(reference_sets != sets, axis=-1)))


def checkpoint_bytes(config, result: cw.Result, source: prune.Source) -> dict:
  """Packed expert bytes and the on-disk bytes of the saved compressed workdir."""
  import ml_collections
  c = ml_collections.ConfigDict(config.to_dict())
  c.model = result.model
  with tempfile.TemporaryDirectory() as scratch:
    prune.save_pruned(scratch, c, result.params, result.rest, source.step, source.data_state)
    disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(scratch)
               for f in files)
  return {"packed_expert_bytes": cw.packed_bytes(result.model, result.params, result.rest),
          "checkpoint_bytes": int(disk)}


def run_study(workdir: str, table: str, *, levels, draws: int, num_windows: int,
              bytes_per_domain: int, probes=(), probe_count: int = 32, group_size: int = 32,
              finetune_steps: int = 32, finetune_lr: float = 1e-4, reroute_windows: int = 16,
              arms=None, log=print, on_run=None, previous: dict | None = None,
              finetuned_control: bool = False) -> dict:
  """{settings, uncompressed: scores, runs: [{level, method, draw, scores, layers}]}.

  previous: an earlier result of the same table and settings (its JSON): its runs
  are kept and not run again, so a study can be stopped and resumed, or given
  more draws. finetuned_control: also fine-tune the uncompressed model's routers
  by the same recipe (steps, learning rate, training batches) and score every
  arm's re-routing against the uncompressed model with its own training history
  ('rerouted_matched': against that control for fine-tuned arms, against the
  uncompressed model otherwise), separating what quantization moves from what
  32 more router steps move on their own (not in the paper)."""
  from moejax.config import expert_counts
  from moejax.data.pipeline import split_documents, train_token_stream
  from moejax.evaluation import harness
  from moejax.evaluation.model import DecoderLM
  from moejax.models.decoder import abstract_model
  from moejax.train.restore import load_from_workdir
  config, step = prune.source_config(workdir)
  arms = [a for a in TABLES[table] if arms is None or a.name in arms]
  for level in levels:
    for arm in arms:
      if arm.applies(level):
        cp.check_request(config.model, request(table, arm, level, 0, group_size))
  source = prune.load_source(workdir, config, step)
  tokenizer = load_from_workdir(workdir, for_generation=True)[4]
  documents = harness.sample_documents(split_documents(config.data), bytes_per_domain)
  settings = harness.Settings(context=config.data.seq_len, probes=tuple(probes),
                              probe_count=probe_count)
  stream = train_token_stream(config.data)
  graphdef = abstract_model(config.model)[0]
  held_out = prune.calibration_windows(_held_out_stream(config, tokenizer), reroute_windows,
                                       config.data.seq_len, seed=12345)
  held_out = [held_out[i:i + 8] for i in range(0, len(held_out), 8)]
  reference_sets = routing_sets(graphdef, source.params, source.rest, held_out)
  m = config.model
  control_sets, control = None, None

  def score(params, finetuned=False):
    evaluation = harness.evaluate(DecoderLM(m, params, source.rest), tokenizer,
                                  tokenizer.eos_id, documents, settings, expert_counts(m))
    sets = routing_sets(graphdef, params, source.rest, held_out)
    out = {"bpb": evaluation.report["bpb"], "probes": evaluation.report["probes"],
           "rerouted": rerouted(reference_sets, sets)}
    if control_sets is not None:
      out["rerouted_matched"] = rerouted(control_sets if finetuned else reference_sets, sets)
    return out

  if finetuned_control:
    if not finetune_steps:
      raise ValueError("finetuned_control needs finetune_steps > 0")
    with tempfile.TemporaryDirectory() as scratch:
      tuned, _ = cw.finetune_routers(scratch, config, m, source.params, source.rest,
                                     source.step, source.data_state, finetune_steps,
                                     finetune_lr)
    control = score(tuned)
    control_sets = routing_sets(graphdef, tuned, source.rest, held_out)
    log(f"fp32 with fine-tuned routers: {control['bpb']['all']:.4f} bpb, re-routed "
        f"{control['rerouted']:.3f} against the fp32 model")
  uncompressed = score(source.params)
  log(f"uncompressed: {uncompressed['bpb']['all']:.4f} bpb")
  names = list(dict.fromkeys(a.name for a in arms))
  runs = list(previous["runs"]) if previous else []
  done = {(r["level"], r["method"], r["draw"]) for r in runs}

  def result():
    return {"workdir": workdir, "step": step, "table": table, "methods": names,
            "levels": [str(v) for v in levels], "draws": draws, "num_windows": num_windows,
            "group_size": group_size, "finetune_steps": finetune_steps,
            "finetune_lr": finetune_lr, "bytes_per_domain": bytes_per_domain,
            "probe_count": probe_count, "finetuned_control": finetuned_control,
            "reference": REFERENCE[table], "uncompressed": uncompressed,
            **({"control": control} if control else {}), "runs": runs}

  sizes = {}
  for draw in range(draws):
    windows = prune.calibration_windows(stream, num_windows, config.data.seq_len, seed=draw)
    calibration = cp.Calibration(graphdef, source.params, source.rest, windows)
    for level in levels:
      for arm in arms:
        if not arm.applies(level) or (str(level), arm.name, draw) in done:
          continue
        first = next((x for x in runs if x["level"] == str(level) and x["method"] == arm.name),
                     None)
        if arm.calibration_free and first is not None:  # the same model on every draw
          runs.append({**first, "draw": draw, "same_model_as_draw": first["draw"]})
          continue
        started = time.time()
        r = request(table, arm, level, draw, group_size)
        out = cw.run(r, source, calibration, rounds=arm.rounds,
                     finetune_steps=finetune_steps if arm.finetune else 0,
                     finetune_lr=finetune_lr, log=log)
        scores = score(out.float_params, finetuned=arm.finetune)
        key = (str(level), arm.name)
        if key not in sizes:
          sizes[key] = (checkpoint_bytes(config, out, source) if out.model is not None
                        else {})
        scores.update(sizes[key])
        scores["expert_parameters"] = out.report.get("parameters")
        scores["average_bits"] = out.report.get("average_bits")
        runs.append({"level": str(level), "method": arm.name, "draw": draw, "scores": scores,
                     "layers": out.report})
        log(f"{table} {level} {arm.name} draw {draw}: {scores['bpb']['all']:.4f} bpb, "
            f"re-routed {scores['rerouted']:.3f} ({time.time() - started:.0f} s)")
        if on_run:
          on_run(result())
  return result()


def _held_out_stream(config, tokenizer) -> np.ndarray:
  """Token ids of the held-out documents, concatenated (for the re-routing windows)."""
  from moejax.data.pipeline import split_documents
  ids = []
  for _, text in split_documents(config.data):
    ids.extend(tokenizer.encode(text))
  return np.asarray(ids, np.int32)


COLUMNS = {
    "quantized": (("average bits", lambda s: f"{s['average_bits']:.2f}"),
                  ("re-routed", lambda s: f"{s['rerouted']:.3f}"),
                  ("packed expert bytes", lambda s: f"{s['packed_expert_bytes']:,}"),
                  ("checkpoint bytes", lambda s: f"{s['checkpoint_bytes']:,}")),
    "factorised": (("expert parameters", lambda s: f"{s['expert_parameters']:,}"),
                   ("re-routed", lambda s: f"{s['rerouted']:.3f}"),
                   ("checkpoint bytes", lambda s: f"{s['checkpoint_bytes']:,}")),
}


def complete_draws(result: dict) -> dict:
  """`result` with only the draws every (level, arm) of the study has run: a
  study stopped mid-draw still pairs every arm on the same draws."""
  arms = [a for a in TABLES[result["table"]] if a.name in result["methods"]]
  wanted = {(lv, a.name) for lv in result["levels"] for a in arms if a.applies(float(lv))}
  draws = sorted({r["draw"] for r in result["runs"]})
  have = {d: {(r["level"], r["method"]) for r in result["runs"] if r["draw"] == d}
          for d in draws}
  complete = [d for d in draws if wanted <= have[d]]
  return {**result, "complete_draws": complete,
          "runs": [r for r in result["runs"] if r["draw"] in complete]}


def equal_bytes_table(result: dict, pairs) -> str:
  """Markdown: per (arm, level) pair, both packed byte counts and the paired bpb
  difference over the draws, with the verdict for 'the first is lower'."""
  from moejax.posttrain import study
  from moejax.train import seed_stats
  lines = ["| arm | packed bytes | against | packed bytes | bpb difference | verdict |",
           "|---|---|---|---|---|---|"]
  for (arm, level), (other, other_level) in pairs:
    a, b = (study.level_runs(result["runs"], lv, m)
            for m, lv in ((arm, level), (other, other_level)))
    if not a or len(a) != len(b):
      continue
    diff = seed_stats.paired_difference([r["scores"]["bpb"]["all"] for r in a],
                                        [r["scores"]["bpb"]["all"] for r in b])
    lines.append(f"| {arm} at {level} | {a[0]['scores']['packed_expert_bytes']:,} | {other} at "
                 f"{other_level} | {b[0]['scores']['packed_expert_bytes']:,} | "
                 f"{study.format_interval(diff)} | {seed_stats.verdict(diff, 'lower', '{:.4f}')} |")
  return "\n".join(lines)


def finetuning_gain_table(result: dict, tuned: str = "gemq_ft", plain: str = "gemq") -> str:
  """Markdown: per level, router fine-tuning's bpb gain on the quantized model minus
  the same fine-tuning's gain on the fp32 model (the control), paired over the
  draws; below 0: fine-tuning repairs more than it improves an unquantized model."""
  from moejax.posttrain import study
  from moejax.train import seed_stats
  control_gain = (result["control"]["bpb"]["all"]
                  - result["uncompressed"]["bpb"]["all"])
  lines = [f"Router fine-tuning on the fp32 model: {control_gain:+.4f} bpb.", "",
           f"| level | {tuned} - {plain} | minus the fp32 gain | verdict |", "|---|---|---|---|"]
  for level in result["levels"]:
    a, b = study.level_runs(result["runs"], level, tuned), study.level_runs(
        result["runs"], level, plain)
    if not a or len(a) != len(b):
      continue
    gains = [x["scores"]["bpb"]["all"] - y["scores"]["bpb"]["all"] for x, y in zip(a, b)]
    gain = seed_stats.paired_difference(gains, [0.0] * len(gains))
    extra = seed_stats.paired_difference(gains, [control_gain] * len(gains))
    lines.append(f"| {level} | {study.format_interval(gain)} | {study.format_interval(extra)} "
                 f"| {seed_stats.verdict(extra, 'lower', '{:.4f}')} |")
  return "\n".join(lines)


def tables(result: dict) -> str:
  """Markdown: the claims (bpb, then re-routing), then per domain the summary, over
  the complete draws (complete_draws)."""
  from moejax.posttrain import study
  result = complete_draws(result)
  table = result["table"]
  columns = COLUMNS["factorised" if table == "td_moe" else "quantized"]
  label = "removed" if table == "td_moe" else "bits"
  kw = {"levels": "levels", "level_label": label}
  parts = [f"Paired over {len(result['complete_draws'])} calibration draws "
           f"(seeds {result['complete_draws']}); held-out bytes per domain: "
           f"{result['bytes_per_domain']}.",
           "### The papers' claims (bpb on all)\n\n"
           + study.claims_table(result, CLAIMS[table], **kw)]
  if table in REROUTE_CLAIMS:
    parts.append("### Re-routed (token, layer) pairs against the uncompressed model\n\n"
                 + study.claims_table(result, REROUTE_CLAIMS[table],
                                      metric=lambda s: s["rerouted"], **kw))
  if table in MATCHED_REROUTE_CLAIMS and result.get("control"):
    c = result["control"]
    parts.append("### Re-routed against the fp32 model with the same router training\n\n"
                 f"The control (fp32, routers fine-tuned by the same recipe): "
                 f"{c['bpb']['all']:.4f} bpb, re-routed {c['rerouted']:.3f} against the fp32 "
                 "model. Fine-tuned arms are compared with it, the others with the fp32 model.\n\n"
                 + study.claims_table(result, MATCHED_REROUTE_CLAIMS[table],
                                      metric=lambda s: s["rerouted_matched"], **kw)
                 + "\n\n" + finetuning_gain_table(result))
  if table in EQUAL_BYTES:
    parts.append("### At about equal packed expert bytes (bpb on all)\n\n"
                 + equal_bytes_table(result, EQUAL_BYTES[table]))
  for domain in result["uncompressed"]["bpb"]:
    parts.append(f"### bpb on {domain}\n\n" + study.summary_table(
        result, domain, base="uncompressed", columns=columns, **kw))
  return "\n\n".join(parts)
