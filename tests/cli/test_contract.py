"""Every entry point refuses bad input with one line on stderr naming it, no
traceback, a non-zero exit, and the filesystem as it was (tests/cli/harness.py)."""

import pytest

from tests.cli.harness import TRAIN_CONFIG
from tests.cli.harness import assert_refused, run_entry, tree_hash

GEN, TRAIN, CONVERT = "experiments.generate", "experiments.train", "experiments.convert"
SERE, STUDY = "experiments.calibrate_sere", "experiments.study"
EVAL, ZOO, PRUNE = "experiments.evaluate", "experiments.zoo", "experiments.prune"
CURSE, ATTRIBUTION = "experiments.repetition_curse", "experiments.routing_attribution"
POLYGLOT, COMPRESS = "experiments.polyglot_report", "experiments.compress"
TEACHER = "experiments.teacher_moe"
GPU_CHECK, GEN_BENCH = "experiments.benchmarks.gpu_check", "experiments.benchmarks.generate"
FINETUNE = "--config=configs/finetune_hf.py:family=mixtral,steps=4,seq_len=32"
T, C, H = "--workdir={train}", "--workdir={converted}", "--hf_dir={hf}"
CFG = f"--config={TRAIN_CONFIG}"
NEW = "--workdir={missing}"

# (entry point, arguments, strings the error line must contain)
CASES = [
  # generate: flags
  (GEN, [T, "--prompt_ids=5,99999"], ["99999", "--prompt_ids=5,99999", "vocabulary"]),
  (GEN, [T, "--prompt_ids=5,-1"], ["-1", "--prompt_ids"]),
  (GEN, [T, "--prompt_ids=a,b"], ["--prompt_ids=a,b", "integers"]),
  (GEN, [T, "--prompt_ids=,"], ["--prompt_ids=,", "at least one"]),
  (GEN, [T, "--max_new_tokens=0"], ["--max_new_tokens=0"]),
  (GEN, [T, "--max_new_tokens=-5"], ["--max_new_tokens=-5"]),
  (GEN, [T, "--max_new_tokens=abc"], ["--max_new_tokens=abc"]),
  (GEN, [T, "--max_new_tokens=100000", "--prompt_ids=1"], ["max_new_tokens", "max_seq_len"]),
  (GEN, [T, "--temperature=-0.1"], ["--temperature=-0.1"]),
  (GEN, [T, "--top_k=-1"], ["--top_k=-1"]),
  (GEN, [T, "--top_k=100000"], ["--top_k=100000", "vocabulary"]),
  (GEN, [T, "--top_p=0"], ["--top_p=0"]),
  (GEN, [T, "--top_p=1.5"], ["--top_p=1.5"]),
  (GEN, [T, "--seed=-1"], ["--seed=-1"]),
  (GEN, [T, "--sere_rho=2"], ["--sere_rho=2"]),
  (GEN, [T, "--no_such_flag=1"], ["no_such_flag"]),
  (GEN, [C, "--prompt=hello"], ["tokenizer", "--prompt=hello"]),
  (GEN, [T, "--prompt="], ["--prompt="]),
  # generate: sources
  (GEN, [], ["--workdir", "--hf_dir"]),
  (GEN, [T, H], ["--workdir", "--hf_dir"]),
  (GEN, [NEW], ["does not exist", "--workdir={missing}"]),
  (GEN, ["--workdir={bad}/afile.txt"], ["a file", "afile.txt"]),
  (GEN, ["--workdir={bad}/foreign"], ["not a moejax workdir", "foreign"]),
  (GEN, ["--workdir={bad}/emptydir"], ["not a moejax workdir", "emptydir"]),
  (GEN, ["--workdir={bad}/train_no_steps"], ["no checkpoint", "train_no_steps"]),
  (GEN, ["--workdir={bad}/train_corrupt"], ["train_corrupt"]),
  (GEN, ["--workdir={bad}/conv_corrupt_config"], ["JSON", "conv_corrupt_config/model/config.json"]),
  (GEN, ["--workdir={bad}/conv_no_model_key"], ["conv_no_model_key/model/config.json"]),
  (GEN, ["--workdir={bad}/conv_truncated"], ["conv_truncated/model/params-"]),
  (GEN, ["--workdir={bad}/conv_wrong_dtype"], ["stored as I8"]),
  (GEN, ["--hf_dir={missing}"], ["--hf_dir={missing}"]),
  (GEN, ["--hf_dir={bad}/afile.txt"], ["--hf_dir={bad}/afile.txt"]),
  (GEN, ["--hf_dir={bad}/hf_corrupt_config"], ["JSON", "hf_corrupt_config/config.json"]),
  (GEN, ["--hf_dir={bad}/hf_empty_config"], ["hf_empty_config/config.json"]),
  (GEN, ["--hf_dir={bad}/hf_list_config"], ["JSON object", "hf_list_config/config.json"]),
  (GEN, ["--hf_dir={bad}/hf_no_config"], ["no config.json", "hf_no_config"]),
  (GEN, ["--hf_dir={bad}/hf_bad_values"], ["hf_bad_values/config.json"]),
  (GEN, ["--hf_dir={bad}/hf_truncated"], ["hf_truncated/model-00001"]),
  (GEN, ["--hf_dir={bad}/hf_garbage_shard"], ["hf_garbage_shard/model-00001"]),
  (GEN, ["--hf_dir={bad}/hf_empty_shard"], ["hf_empty_shard/model-00001"]),
  (GEN, ["--hf_dir={bad}/hf_missing_shard"], ["model-00001", "is missing"]),
  (GEN, ["--hf_dir={bad}/hf_bad_index"], ["hf_bad_index/model.safetensors.index.json"]),
  (GEN, ["--hf_dir={bad}/hf_no_weights"], ["hf_no_weights", "model.safetensors"]),
  (GEN, ["--hf_dir={bad}/hf_wrong_dtype"], ["stored as I8"]),
  (GEN, ["--hf_dir={bad}/hf_wrong_shape"], ["has shape (3, 5)"]),
  # generate: SERE similarity files
  (GEN, [T, "--sere_similarity={missing}.npy"], ["does not exist", "--sere_similarity="]),
  (GEN, [T, "--sere_similarity={bad}/empty.npy"], ["empty", "empty.npy"]),
  (GEN, [T, "--sere_similarity={bad}/garbage.npy"], ["garbage.npy"]),
  (GEN, [T, "--sere_similarity={bad}/wrong_shape.npy"], ["(2, 3)", "wrong_shape.npy"]),
  (GEN, [T, "--sere_similarity={bad}/int.npy"], ["int32", "int.npy"]),
  # train
  (
    TRAIN,
    [CFG, NEW, "--config.model.moe.nonexistent_key=3"],
    ["unknown config key model.moe.nonexistent_key", "--config.model.moe.nonexistent_key=3"],
  ),
  (TRAIN, [CFG, NEW, "--config.nonexistent.key=3"], ["unknown config key nonexistent.key"]),
  (TRAIN, [CFG, NEW, "--config.model.moe.dropless_tile=64"], ["use model.moe.dropless.tile"]),
  (
    TRAIN,
    [CFG, NEW, "--config.model.moe.renormalize=False"],
    ["use model.moe.routing.renormalize", "--config.model.moe.renormalize=False"],
  ),
  (TRAIN, [CFG, NEW, "--config.model.d_model=-1"], ["model.d_model=-1"]),
  (TRAIN, [CFG, NEW, "--config.train.trainable=experts"], ["train.trainable", "router"]),
  (
    TRAIN,
    [CFG, NEW, "--config.model.moe.experts=quantized", "--config.model.moe.quantized.bits=5"],
    ["quantized.bits=5", "supported"],
  ),
  (
    TRAIN,
    [
      CFG,
      NEW,
      "--config.model.moe.experts=quantized",
      "--config.model.moe.quantized.group_size=12",
    ],
    ["group_size=12", "divide"],
  ),
  (
    TRAIN,
    [
      CFG,
      NEW,
      "--config.model.moe.experts=factorised",
      "--config.model.moe.factorised.ranks_gate=(0,64,0)",
    ],
    ["rank_in=64", "exceeds"],
  ),
  (TRAIN, ["--config=configs/workdir.py", NEW], ["configs/workdir.py:path=DIR"]),
  (TRAIN, ["--config=configs/workdir.py:path={missing}", NEW], ["{missing}"]),
  (TRAIN, [CFG, NEW, "--config.model.d_model=wide"], ["--config.model.d_model=wide"]),
  (TRAIN, [CFG, NEW, "--config.train.steps=0"], ["train.steps=0"]),
  (TRAIN, [CFG, NEW, "--config.data.batch_size=0"], ["data.batch_size=0"]),
  (TRAIN, ["--config={missing}.py", NEW], ["cannot load the config file", "--config={missing}.py"]),
  (TRAIN, ["--config=configs/lm_shakespeare_moe.py:size=huge", NEW], ["size='huge'"]),
  (TRAIN, [NEW], ["--config"]),
  (TRAIN, [CFG], ["--workdir"]),
  (TRAIN, [CFG, NEW, "--stop_at_step=0"], ["--stop_at_step=0"]),
  (TRAIN, [CFG, NEW, "--stop_at_step=-3"], ["--stop_at_step=-3"]),
  (
    TRAIN,
    [CFG, NEW, "--config.init.hf_dir={hf}"],
    ["holds a mixtral model", "model.family='moejax'", "init.hf_dir="],
  ),
  (TRAIN, [CFG, NEW, "--config.init.hf_dir={missing}"], ["init.hf_dir={missing}"]),
  (TRAIN, [CFG, NEW, "--stop_at_step=1000000"], ["--stop_at_step=1000000", "train.steps"]),
  (TRAIN, [CFG, NEW, "--num_processes=0"], ["--num_processes=0"]),
  (TRAIN, [CFG, NEW, "--process_id=-1"], ["--process_id=-1"]),
  (TRAIN, [CFG, NEW, "--process_id=2", "--num_processes=2"], ["--process_id=2"]),
  (TRAIN, [CFG, NEW, "--coordinator_address=nohost"], ["--coordinator_address=nohost"]),
  (TRAIN, [CFG, NEW, "--distributed=maybe"], ["--distributed=maybe"]),
  (TRAIN, [CFG, C], ["imported model", "training run", "--allow_mixed"]),
  (TRAIN, [CFG, "--workdir={bad}/afile.txt"], ["a file", "afile.txt"]),
  (TRAIN, [CFG, "--workdir={bad}/foreign"], ["not a moejax workdir", "foreign"]),
  (TRAIN, [CFG, T, "--config.model.d_model=96"], ["incompatible", "model.d_model"]),
  (TRAIN, [CFG, "--workdir={bad}/train_corrupt"], ["cannot read checkpoint"]),
  # convert
  (CONVERT, [], ["--hf_dir", "--workdir", "--out_hf_dir"]),
  (CONVERT, [H, T], ["training run", "imported model", "--allow_mixed"]),
  (CONVERT, [H, "--workdir={bad}/foreign"], ["not a moejax workdir"]),
  (CONVERT, [H, "--workdir={bad}/afile.txt"], ["a file"]),
  (CONVERT, ["--hf_dir={missing}", NEW], ["--hf_dir={missing}"]),
  (CONVERT, ["--hf_dir={bad}/hf_corrupt_config", NEW], ["hf_corrupt_config/config.json"]),
  (CONVERT, ["--hf_dir={bad}/hf_truncated", NEW], ["hf_truncated/model-00001"]),
  (CONVERT, ["--hf_dir={bad}/hf_wrong_dtype", NEW], ["stored as I8"]),
  (CONVERT, [H, NEW, "--max_shard_mb=10"], ["--max_shard_mb=10", "export"]),
  (CONVERT, [H, NEW, "--param_dtype=int4"], ["--param_dtype=int4"]),
  (CONVERT, [T, "--out_hf_dir={missing}", "--max_shard_mb=0"], ["--max_shard_mb=0"]),
  (CONVERT, [T, "--out_hf_dir={missing}", "--max_shard_mb=-5"], ["--max_shard_mb=-5"]),
  (CONVERT, [T, "--out_hf_dir={missing}", "--family=llama"], ["--family=llama"]),
  (CONVERT, [T, "--out_hf_dir={missing}", "--dtype=int8"], ["--dtype=int8"]),
  (
    CONVERT,
    [T, "--out_hf_dir={missing}", "--param_dtype=bfloat16"],
    ["--param_dtype=bfloat16", "import"],
  ),
  (CONVERT, [T, "--out_hf_dir={bad}/foreign"], ["--out_hf_dir={bad}/foreign", "empty"]),
  (CONVERT, [H, NEW, "--check_logits"], ["--check_logits", "export"]),
  (CONVERT, [T, "--out_hf_dir={missing}", "--check_logits", "--check_atol=0"], ["--check_atol=0"]),
  (
    CONVERT,
    [T, "--out_hf_dir={missing}", "--check_logits", "--dtype=bfloat16"],
    ["--check_logits", "float32", "bfloat16"],
  ),
  (CONVERT, [NEW, "--out_hf_dir={missing}2"], ["does not exist", "--workdir={missing}"]),
  (CONVERT, ["--workdir={bad}/conv_truncated", "--out_hf_dir={missing}"], ["conv_truncated"]),
  # study: the training studies
  (STUDY, ["--config={missing}.py"], ["--config={missing}.py"]),
  (
    STUDY,
    ["--config=configs/studies/routers.py", "--config.settings.workdir={bad}/afile.txt"],
    ["study.settings.workdir", "afile.txt"],
  ),
  (
    STUDY,
    ["--config=configs/studies/routers.py", "--config.settings.workdir={train}"],
    ["{train}", "not a training path"],
  ),
  (
    STUDY,
    ["--config=configs/studies/routers.py", "--config.no_such_key=1"],
    ["unknown config key no_such_key"],
  ),
  (
    STUDY,
    [
      "--config=configs/studies/routers_seeds.py:base=polyglot",
      "--config.settings.seeds=(0, 1, 0)",
    ],
    ["twice"],
  ),
  # calibrate_sere
  (SERE, [NEW], ["does not exist", "--workdir={missing}"]),
  (SERE, [C], ["imported model", "--workdir={converted}"]),
  (SERE, [T, "--batches=0"], ["--batches=0"]),
  (SERE, [T, "--out={missing}/sub/similarity.npy"], ["--out={missing}/sub/similarity.npy"]),
  (SERE, [T, "--out={bad}"], ["directory", "--out={bad}"]),
  # study: inference-time routers and the phenomena ablation
  (
    STUDY,
    [
      "--config=configs/studies/router_inference_capacity.py",
      "--config.settings.workdir={missing}",
    ],
    ["{missing}"],
  ),
  (
    STUDY,
    [
      "--config=configs/studies/router_inference_sere.py",
      "--config.settings.workdir={train}",
      "--config.settings.calibration_batches=0",
    ],
    ["study.settings.calibration_batches=0"],
  ),
  (
    STUDY,
    ["--config=configs/studies/phenomena.py", "--config.settings.workdir={missing}"],
    ["{missing}"],
  ),
  # evaluate
  (EVAL, [], ["--workdir", "--hf_dir"]),
  (EVAL, [T, H], ["--workdir", "--hf_dir"]),
  (
    EVAL,
    [T, "--reference_workdir={train}", "--reference_hf_dir={hf}"],
    ["--reference_workdir", "--reference_hf_dir"],
  ),
  (EVAL, [T, "--reference_workdir={missing}"], ["does not exist", "--reference_workdir"]),
  (EVAL, [C], ["give --docs", "--workdir={converted}"]),
  (EVAL, [H], ["give --docs", "--hf_dir={hf}"]),
  (EVAL, [T, "--probes=facts,trivia"], ["'trivia'", "--probes=facts,trivia"]),
  (EVAL, [T, "--docs={bad}/afile.txt"], ["not a JSON line", "afile.txt, line 1"]),
  (EVAL, [T, "--docs={bad}/empty.npy"], ["empty", "--docs={bad}/empty.npy"]),
  (EVAL, [T, "--out={bad}"], ["directory", "--out={bad}"]),
  (EVAL, [T, "--stride=-1"], ["--stride=-1"]),
  (EVAL, [T, "--bootstrap_resamples=0"], ["--bootstrap_resamples=0"]),
  (EVAL, [T, "--bytes_per_domain=-1"], ["--bytes_per_domain=-1"]),
  # zoo
  # prune (tiny default: 8 experts, top-2, 2 MoE layers)
  (PRUNE, [T], ["--keep"]),
  (PRUNE, [T, "--keep=9"], ["--keep=9", "larger than", "8 experts"]),
  (PRUNE, [T, "--keep=1"], ["--keep=1", "below", "top_k=2"]),
  (PRUNE, [T, "--keep=1.5"], ["--keep=1.5", "(0, 1]"]),
  (PRUNE, [T, "--keep=half"], ["--keep=half", "fraction", "knee"]),
  (PRUNE, [T, "--keep=4", "--method=obs"], ["--method='obs'", "schur_astar"]),
  (PRUNE, [T, "--keep=4", "--objective=l1"], ["--objective='l1'", "no_rescale"]),
  (
    PRUNE,
    [T, "--keep=4", "--objective=no_rescale", "--rescale"],
    ["--rescale", "--objective=no_rescale"],
  ),
  (
    PRUNE,
    [T, "--keep=4", "--num_windows=1", "--context=4"],
    ["--num_windows=1", "--context=4", "calibration statistics"],
  ),
  (PRUNE, [T, "--keep=4", "--context=100000"], ["--context=100000", "max_seq_len"]),
  (PRUNE, [C, "--keep=4"], ["give --calibration", "--workdir={converted}"]),
  (PRUNE, [H, "--keep=4"], ["give --calibration", "--hf_dir={hf}"]),
  (PRUNE, ["--keep=4"], ["--workdir", "--hf_dir"]),
  (PRUNE, [H, "--keep=4", "--calibration={bad}/garbage.npy"], ["garbage.npy"]),
  (PRUNE, [H, "--keep=4", "--calibration={bad}/afile.txt"], [".npy", "afile.txt"]),
  (PRUNE, [H, "--keep=4", "--calibration={bad}/wrong_shape.npy"], ["token ids", "float32"]),
  (PRUNE, ["--workdir={bad}/train_dense", "--keep=4"], ["no MoE layer", "train_dense"]),
  (PRUNE, [T, "--keep=4", "--out={train}"], ["new or empty", "--out={train}"]),
  (PRUNE, [T, "--keep=4", "--method=heapr"], ["--keep=4", "atom method", "fraction"]),
  (PRUNE, [T, "--keep=0", "--method=heapr"], ["--keep=0", "(0, 1]"]),
  (PRUNE, [T, "--keep=knee", "--method=step"], ["--keep=knee", "--method=step"]),
  (PRUNE, [T, "--keep=knee", "--method=heapr"], ["--keep=knee", "atom method"]),
  (PRUNE, [T, "--keep=4", "--report={bad}"], ["directory", "--report={bad}"]),
  # compress (tiny default: d_model = expert_d_ff = 32, 2 MoE layers)
  (COMPRESS, [T], ["--level"]),
  (COMPRESS, [T, "--level=3", "--method=awq"], ["--method='awq'", "gemq"]),
  (COMPRESS, [T, "--level=3", "--quantizer=awq"], ["--quantizer='awq'", "gptq"]),
  (COMPRESS, [T, "--level=1.5"], ["--level=1.5", "below the minimum", "2 bits"]),
  (COMPRESS, [T, "--level=3", "--bit_choices=2,5"], ["--bit_choices", "5 bits", "not supported"]),
  (COMPRESS, [T, "--level=3", "--bit_choices=2,x"], ["--bit_choices=2,x", "integer"]),
  (COMPRESS, [T, "--level=2.5", "--method=uniform"], ["--level=2.5", "uniform"]),
  (COMPRESS, [T, "--level=9"], ["--level=9", "above the widest", "8"]),
  (COMPRESS, [T, "--level=3", "--group_size=12"], ["--group_size=12", "divide"]),
  (COMPRESS, [T, "--level=1.2", "--method=td_moe"], ["--level=1.2", "(0, 1)"]),
  (COMPRESS, [T, "--level=3", "--method=uniform", "--rounds=2"], ["--rounds=2", "gemq"]),
  (COMPRESS, [T, "--level=0.4", "--method=svd", "--out={missing}"], ["svd", "no expert type"]),
  (COMPRESS, [T, "--level=3", "--out={train}"], ["new or empty", "--out={train}"]),
  (COMPRESS, [T, "--level=3", "--report={bad}"], ["directory", "--report={bad}"]),
  (COMPRESS, [C, "--level=3"], ["training run", "--workdir={converted}"]),
  (COMPRESS, ["--workdir={bad}/train_dense", "--level=3"], ["no MoE layer", "train_dense"]),
  (COMPRESS, [T, "--level=3", "--num_windows=1"], ["--num_windows=1", "fewer than 16 per expert"]),
  (CURSE, [T, "--expert_shards=3"], ["--expert_shards=3", "divisor", "8 experts"]),
  (CURSE, [T, "--length=100000"], ["--length=100000", "max_seq_len"]),
  (CURSE, [T, "--capacity_factor=-1"], ["--capacity_factor=-1"]),
  (CURSE, [T, "--out={bad}"], ["directory", "--out={bad}"]),
  (CURSE, [C], ["training run", "--workdir={converted}"]),
  (CURSE, ["--workdir={bad}/train_dense"], ["MoE model", "train_dense"]),
  (ATTRIBUTION, [T, "--num_windows=0"], ["--num_windows=0"]),
  (ATTRIBUTION, [T, "--plot={bad}"], ["directory", "--plot={bad}"]),
  (ATTRIBUTION, [C], ["training run", "--workdir={converted}"]),
  (ATTRIBUTION, ["--workdir={bad}/train_dense"], ["MoE model", "train_dense"]),
  (
    STUDY,
    ["--config=configs/studies/pruning_knee.py", "--config.settings.workdir={train}"],
    ["study.levels[1].keep=9", "larger than"],
  ),
  (
    STUDY,
    [
      "--config=configs/studies/pruning.py",
      "--config.settings.workdir={train}",
      "--config.settings.num_windows=1",
    ],
    ["study.settings.num_windows=1", "fewer than 16 per expert"],
  ),
  (
    STUDY,
    [
      "--config=configs/studies/gemq.py",
      "--config.settings.workdir={train}",
      "--config.settings.group_size=12",
    ],
    ["study.settings.group_size=12", "divide"],
  ),
  (
    STUDY,
    ["--config=configs/studies/pruning.py", "--config.settings.workdir={bad}/train_dense"],
    ["no MoE layer", "train_dense"],
  ),
  (
    STUDY,
    [
      "--config=configs/studies/pruning.py",
      "--config.settings.workdir={train}",
      "--config.draws=0",
    ],
    ["study.draws=0"],
  ),
  (POLYGLOT, [], ["--workdir", "--sweep_dir"]),
  (POLYGLOT, [T, "--sweep_dir={bad}"], ["--workdir", "--sweep_dir"]),
  (POLYGLOT, ["--sweep_dir={bad}/emptydir"], ["ARM/seed_N", "--sweep_dir={bad}/emptydir"]),
  # outputs checked with the inputs: format, directory, inside an input
  (ATTRIBUTION, [T, "--plot={root}/heatmap.nope"], ["--plot={root}/heatmap.nope", ".png"]),
  (ATTRIBUTION, [T, "--plot={missing}/heatmap.png"], ["does not exist", "--plot="]),
  (SERE, [T, "--out={root}/similarity.txt"], [".npy", "--out={root}/similarity.txt"]),
  (SERE, [T, "--out="], ["--out="]),
  (TEACHER, ["--json={missing}/run.json"], ["does not exist", "--json={missing}/run.json"]),
  (TEACHER, ["--json={bad}/afile.txt/run.json"], ["afile.txt", "--json="]),
  (POLYGLOT, [T, "--json={bad}"], ["directory", "--json={bad}"]),
  (POLYGLOT, ["--sweep_dir={missing}"], ["existing directory", "--sweep_dir={missing}"]),
  (POLYGLOT, ["--sweep_dir={bad}/afile.txt"], ["existing directory", "afile.txt"]),
  (POLYGLOT, ["--workdir={missing}"], ["does not exist", "--workdir={missing}"]),
  (
    PRUNE,
    [T, "--keep=4", "--out={train}/pruned"],
    ["inside the input --workdir", "--out={train}/pruned"],
  ),
  (PRUNE, [T, "--keep=4", "--out={bad}/afile.txt"], ["not a file", "--out="]),
  (PRUNE, [T, "--keep=4", "--save_statistics={root}/stats.npy"], [".npz", "--save_statistics"]),
  (COMPRESS, [T, "--level=3", "--out={train}/compressed"], ["inside the input --workdir"]),
  (CONVERT, [T, "--out_hf_dir={train}/hf"], ["inside the input --workdir", "--out_hf_dir"]),
  (CONVERT, [H, "--workdir={hf}/imported"], ["inside the input --hf_dir", "--workdir"]),
  (CONVERT, [T, "--out_hf_dir="], ["--out_hf_dir="]),
  (
    EVAL,
    [T, "--docs={bad}/empty_text.jsonl", "--out={bad}/empty_text.jsonl"],
    ["inside the input --docs", "--out="],
  ),
  (
    STUDY,
    ["--config=configs/studies/interval_coverage.py", "--out={bad}/afile.txt"],
    ["not a file", "--out="],
  ),
  # values checked at both ends; empty lists
  (
    PRUNE,
    [H, "--keep=4", "--calibration={bad}/negative_ids.npy"],
    ["token id -3", "[0, 256)", "--calibration={bad}/negative_ids.npy"],
  ),
  (COMPRESS, [T, "--level=1.5", "--method=codequant"], ["--level=1.5", "[2, 8]", "codequant"]),
  (COMPRESS, [T, "--level=8.5", "--method=kmeans"], ["--level=8.5", "[2, 8]", "kmeans"]),
  (COMPRESS, [T, "--level=3", "--bit_choices="], ["--bit_choices=", "at least one"]),
  (COMPRESS, [T, "--level=3", "--finetune_lr=0"], ["--finetune_lr=0"]),
  (TEACHER, ["--teacher_seeds="], ["--teacher_seeds=", "at least one"]),
  (TEACHER, ["--learning_rate=inf"], ["--learning_rate=inf", "finite"]),
  (GEN, [T, "--temperature=inf"], ["--temperature=inf", "finite"]),
  (GEN, [T, "--sere_similarity="], ["--sere_similarity="]),
  # messages that name the right thing
  (
    PRUNE,
    [H, "--keep=4", "--calibration={bad}/short_ids.npy", "--context=16"],
    ["--calibration={bad}/short_ids.npy has 10 tokens"],
  ),
  (EVAL, [T, "--reference_hf_dir={hf}"], ["tokenizer", "--reference_hf_dir={hf}"]),
  (EVAL, [T, "--docs={bad}/empty_text.jsonl"], ["no tokens", "empty_text.jsonl, line 2"]),
  # a required setting without a silent default; nothing left behind by a refused run
  (TRAIN, [FINETUNE, NEW], ["init.hf_dir", "model.family='mixtral'"]),
  (
    TRAIN,
    ["--config=configs/finetune_hf.py:family=moejax,steps=4,seq_len=32", NEW],
    ["init.requires_hf_dir=True", "--config.init.hf_dir=DIR"],
  ),
  (TRAIN, [FINETUNE, NEW, "--config.init.hf_dir={bad}/hf_truncated"], ["hf_truncated"]),
  (
    TRAIN,
    ["--config=configs/lora_mixer.py:top_k=5", "--config.init.hf_dir={converted}", NEW],
    ["model.attention.lora_mixer.top_k=5", "model.attention.lora_mixer.num_experts=4"],
  ),
  (
    TRAIN,
    ["--config=configs/lora_mixer.py:rank=0", "--config.init.hf_dir={converted}", NEW],
    ["model.attention.lora_mixer.rank=0"],
  ),
  (
    TRAIN,
    ["--config=configs/lora_mixer.py:place=mlp", "--config.init.hf_dir={converted}", NEW],
    ["config arg place", "'mlp'", "attention, ffn"],
  ),
  (ZOO, ["--models=xs,m"], ["--models", "'m'", "xs, s, s_dense, xs_dense, s_upcycled"]),
  (ZOO, ["--models="], ["--models", "at least one"]),
  (ZOO, ["--zoo_dir={missing}", "--verify"], ["--zoo_dir", "built zoo", "xs"]),
  (ZOO, ["--time_steps=-1"], ["--time_steps=-1"]),
  (ZOO, ["--bytes_per_domain=0"], ["--bytes_per_domain=0"]),
  (ZOO, ["--seeds=0,x"], ["--seeds", "integers", "'x'"]),
  (ZOO, ["--seeds=-1"], ["--seeds", "[0, 2**31)"]),
  (ZOO, ["--seeds=1,1"], ["--seeds", "distinct"]),
  (ZOO, ["--seeds="], ["--seeds", "at least one"]),
  (GPU_CHECK, ["--dry_run", "--mosaic=128:128"], ["'128:128'", "five positive", "--mosaic="]),
  (GPU_CHECK, ["--dry_run", "--shapes=huge"], ["'huge'", "--shapes=", "coarse"]),
  (GEN_BENCH, ["--dtype=bfloat16", "--experts=quantized_4bit"], ["--dtype", "float32 ones"]),
  (GEN_BENCH, ["--dtype=float16"], ["--dtype", "float16"]),
]


def case_id(case):
  module, args, _ = case
  return module.split(".")[-1] + ":" + " ".join(args).replace("{", "").replace("}", "")


def refused(area, module, args, names):
  """Run `module args` (placeholders filled from area) and check the whole contract."""

  def fill(s):
    return s.format(**vars(area))

  before = tree_hash(area.root)
  result = run_entry(module, *map(fill, args))
  line = assert_refused(result, *map(fill, names))
  assert tree_hash(area.root) == before, f"the tmp area changed; error was: {line}"
  return line


@pytest.mark.parametrize("module, args, names", CASES, ids=[case_id(c) for c in CASES])
def test_refused(area, module, args, names):
  refused(area, module, args, names)


def test_verbose_shows_the_traceback(area):
  result = run_entry(GEN, f"--workdir={area.train}", "--prompt_ids=5,99999", "--verbose")
  assert result.code == 2
  assert "Traceback" in result.stderr and "ConfigError" in result.stderr
  assert result.stderr.splitlines()[-1].startswith("error: token id 99999")


def test_verbose_shows_the_traceback_of_a_refused_config_key(area):
  result = run_entry(TRAIN, CFG, f"--workdir={area.missing}", "--config.model.nope=1", "--verbose")
  assert result.code == 2 and "Traceback" in result.stderr
  assert result.stderr.splitlines()[-1].startswith("error: unknown config key model.nope")
