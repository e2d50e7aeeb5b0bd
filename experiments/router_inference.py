r"""Inference-time routers on a trained default model (issue 6): capacity-aware
drop, SERE re-routing and As-COOT, each against the model's own top-k.

  python -m experiments.router_inference --workdir=runs/moe \
      --markdown=docs/results/router_inference_cpu.md --json=docs/results/router_inference_cpu.json

Studies (--studies, default all three):
  capacity  Token Drop (r=1) and Expanded Drop (r=2) at gamma in --gammas, on the
            validation batches (one call = one [batch, seq_len] block, as a prefill):
            bpb, max/mean load, max load, kept assignments per token.
  sere      expert similarity (linear CKA) calibrated on --calibration_batches training
            batches, written into SERE's router state; then teacher-forced KV-cache
            decoding of --decode_windows validation windows at batch sizes
            --decode_batches and thresholds --rhos: bpb and distinct experts per step.
  as_coot   semi-relaxed Sinkhorn routing (tau in --taus; 0 = balanced Sinkhorn) on
            batches cut from one held-out play at a time (a shifted batch): bpb and
            max/mean load.
All three routers are non-causal by design (a token's experts depend on the
other tokens of the call); bpb is the model's loss under that routing.
"""
import json

from absl import flags
import numpy as np

from moejax import cli
from moejax.errors import ConfigError

from moejax.analysis import router_inference as ri
from moejax.data.shakespeare import shakespeare_sources
from moejax.data.pipeline import build_lm_data
from moejax.train.restore import load_from_workdir
from moejax.interop.load import from_training_workdir

_WORKDIR = flags.DEFINE_string("workdir", "runs/moe", "A trained MoE LM's workdir.")
_STUDIES = cli.checked(flags.DEFINE_list("studies", ["capacity", "sere", "as_coot"],
                                         "Which studies."),
                       cli.one_of("capacity", "sere", "as_coot"))
_GAMMAS = cli.checked(flags.DEFINE_list("gammas", ["0.5", "1", "1.5", "2"], "Capacity factors "
                                        "gamma."), cli.in_range(0, float("inf"), low_open=True))
_EVAL_BATCHES = cli.checked(flags.DEFINE_integer("eval_batches", 8, "Validation batches "
                                                 "(capacity)."), cli.at_least(1))
_CALIBRATION = cli.checked(flags.DEFINE_integer("calibration_batches", 2, "Training batches "
                                                "(SERE CKA)."), cli.at_least(1))
_WINDOWS = cli.checked(flags.DEFINE_integer("decode_windows", 64, "Validation windows decoded "
                                            "(SERE)."), cli.at_least(1))
_DECODE_LEN = cli.checked(flags.DEFINE_integer("decode_len", 64, "Tokens decoded per window "
                                               "(SERE)."), cli.at_least(1))
_BATCHES = cli.checked(flags.DEFINE_list("decode_batches", ["8", "16", "32", "64"], "Decode "
                                         "batch sizes."), cli.at_least(1))
_RHOS = cli.checked(flags.DEFINE_list("rhos", ["0.7", "0.5", "0.3", "0.2", "0.1"], "SERE "
                                      "thresholds rho."), cli.in_range(0, 1))
_TAUS = cli.checked(flags.DEFINE_list("taus", ["1", "0"], "As-COOT tau (0 = infinity)."),
                    cli.at_least(0.0, float))
_PLAY_BATCHES = cli.checked(flags.DEFINE_integer("play_batches", 2, "Batches per held-out play "
                                                 "(As-COOT)."), cli.at_least(1))
_MARKDOWN = flags.DEFINE_string("markdown", None, "Write the tables here.")
_JSON = flags.DEFINE_string("json", None, "Write the records here.")


def table(rows: list[dict], columns: list[str]) -> str:
  fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(fmt(r.get(c, "—")) for c in columns) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def capacity_study(config, params, rest, batches):
  k = config.model.moe.top_k
  _, base = ri.with_router(config)
  rows = [{"router": "top-k", "gamma": "—", "r": "—",
           **ri.score_batches(base, params, rest, batches, k)}]
  for r in (1.0, 2.0):
    for gamma in map(float, _GAMMAS.value):
      _, graphdef = ri.with_router(config, router="capacity_aware",
                                   capacity_aware=dict(gamma=gamma, expand_r=r))
      rows.append({"router": "token drop" if r == 1 else "expanded drop", "gamma": gamma,
                   "r": r, **ri.score_batches(graphdef, params, rest, batches, k)})
  return rows


def sere_study(workdir, config, graphdef, params, rest, calibration, windows):
  similarity = ri.calibrate_similarity(graphdef, params, rest, calibration)
  loaded, _ = from_training_workdir(workdir)
  m = loaded.config
  rows = []
  for batch in map(int, _BATCHES.value):
    rows.append({"router": "top-k", "batch": batch, "rho": "—",
                 **ri.decode_score(m, loaded.params, loaded.rest, windows, batch)})
    for rho in map(float, _RHOS.value):
      m_sere, rest_sere = ri.with_sere(m, loaded.rest, similarity, rho)
      rows.append({"router": "sere", "batch": batch, "rho": rho,
                   **ri.decode_score(m_sere, loaded.params, rest_sere, windows, batch)})
  return rows, np.asarray(similarity)


def play_batches(config, tokenizer, num_batches):
  """{play: [batches]} of consecutive windows from one held-out play each."""
  b, l = config.data.batch_size, config.data.seq_len
  out = {}
  for example in shakespeare_sources(config.data.data_dir)["validation"]:
    tokens = np.asarray(tokenizer.encode(example["text"].decode()), np.int32)
    windows = tokens[:num_batches * b * (l + 1)].reshape(num_batches, b, l + 1)
    out[example["title"].decode()] = [{"inputs": w[:, :-1], "targets": w[:, 1:]}
                                      for w in windows]
  return out


def as_coot_study(config, params, rest, plays):
  k, rows = config.model.moe.top_k, []
  _, base = ri.with_router(config)
  for play, batches in plays.items():
    rows.append({"play": play, "router": "top-k", "tau": "—",
                 **ri.score_batches(base, params, rest, batches, k)})
    for tau in map(float, _TAUS.value):
      _, graphdef = ri.with_router(config, router="as_coot", as_coot=dict(tau=tau))
      rows.append({"play": play, "router": "as_coot", "tau": "inf" if tau == 0 else tau,
                   **ri.score_batches(graphdef, params, rest, batches, k)})
  return rows


def main(argv):
  del argv
  if not _STUDIES.value:
    raise cli.flag_error(_STUDIES, "expected at least one study")
  cli.existing_workdir("workdir", _WORKDIR.value, kinds=("training", "mixed"))
  cli.output_file("markdown", _MARKDOWN.value)
  cli.output_file("json", _JSON.value)
  config, graphdef, params, rest, tokenizer = load_from_workdir(_WORKDIR.value)
  if config.model.ffn_type != "moe":
    raise ConfigError(f"model.ffn_type={config.model.ffn_type!r}: these studies need an MoE "
                      f"model (--workdir={_WORKDIR.value})")
  data = build_lm_data(config.data, seed=config.seed)
  if data.bytes_per_token != 1.0:
    raise ConfigError(f"data.tokenizer={config.data.tokenizer!r}: bpb here assumes the byte "
                      f"tokenizer (--workdir={_WORKDIR.value})")
  eval_batches = list(data.eval_batches(None))
  report, records = [f"# Inference-time routers on {_WORKDIR.value}\n"], {}
  if "capacity" in _STUDIES.value:
    rows = capacity_study(config, params, rest, eval_batches[:_EVAL_BATCHES.value])
    records["capacity"] = rows
    report.append("## Capacity-aware Token Drop / Expanded Drop\n\n" + table(
        rows, ["router", "gamma", "r", "bpb", "max_over_mean_load", "max_load",
               "experts_per_token", "kept_fraction"]))
  if "sere" in _STUDIES.value:
    need = _WINDOWS.value
    windows = np.concatenate([np.concatenate([b["inputs"], b["targets"][:, -1:]], 1)
                              for b in eval_batches])[:need, :_DECODE_LEN.value + 1]
    calibration = np.concatenate([next(data.train_iter)["inputs"]
                                  for _ in range(_CALIBRATION.value)])
    rows, similarity = sere_study(_WORKDIR.value, config, graphdef, params, rest,
                                  calibration, windows)
    records["sere"], records["sere_similarity"] = rows, similarity.tolist()
    off = similarity[:, ~np.eye(similarity.shape[1], dtype=bool)].astype(np.float64)
    stat = lambda v: ", ".join(f"{x:.2f}" for x in v)
    report.append(
        "## SERE re-routing in batched decoding\n\n"
        f"Linear CKA between experts, off-diagonal, per MoE layer: min [{stat(off.min(1))}], "
        f"median [{stat(np.median(off, 1))}], max [{stat(off.max(1))}].\n\n"
        + table(rows, ["router", "batch", "rho", "bpb", "distinct_experts"]))
  if "as_coot" in _STUDIES.value:
    rows = as_coot_study(config, params, rest,
                         play_batches(config, tokenizer, _PLAY_BATCHES.value))
    records["as_coot"] = rows
    report.append("## As-COOT on one held-out play per batch\n\n" + table(
        rows, ["play", "router", "tau", "bpb", "max_over_mean_load", "max_load"]))
  text = "\n".join(report)
  print(text)
  if _MARKDOWN.value:
    with open(_MARKDOWN.value, "w") as f:
      f.write(text)
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(records, f, indent=1, default=lambda v: None if v != v else v)


if __name__ == "__main__":
  cli.run(main)
