"""A small mutation tester: one deliberate bug at a time, the matching tests run.

    python scripts/mutate.py --tree /tmp/mutwt [--max_per_file 20] [--only sharding,posttrain/]
        [--survivors_of earlier.json]

Run it on a *copy* of the repository (e.g. `git worktree add --detach /tmp/mutwt
HEAD`), never on the checkout you work in: each mutant is written into the
copy's file, its tests run, and the file restored. Tests run with the copy as
the working directory, so the copy's moejax is the one imported (checked).

Mutants (from the AST, so comments and docstrings are never touched):
  binop     + <-> -, * <-> /, // -> /, % -> //
  compare   < <-> <=, > <-> >=, == <-> !=
  const     integer n -> n + 1, float x -> 2x (0.0 -> 1.0), True <-> False
  drop      a + b -> a, a - b -> a (a dropped term)
  swap      f(a, b) -> f(b, a) for two-positional-argument calls
  unary     -x -> x, not x -> x
  string    a string in a tuple/list (e.g. a mesh-axis name) -> another one of that tuple
A mutant is *killed* when its tests fail (or time out, or fail to collect), *survives*
when they pass; a pytest internal or usage error (exit status 3, 4) is an *error*, not counted.
Candidates are spread evenly over each file and capped (--max_per_file), so a run
stays short; the selection is deterministic.
"""

import argparse
import ast
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

# module -> the tests that should catch its bugs (kept to fast files)
TARGETS = {  # module -> tests; --max_per_file caps every module's mutants
  "moejax/losses/balance.py": [
    "tests/losses/test_balance.py",
    "tests/layers/test_moe_layer.py::test_load_balance_loss_closed_form",
    "tests/layers/test_moe_layer.py::test_z_loss_closed_form",
  ],
  "moejax/losses/dpsl.py": ["tests/losses/test_dpsl.py"],
  "moejax/routing/topk.py": [
    "tests/routing/test_routers.py::test_topk_matches_brute_force",
    "tests/routing/test_topk_validation.py",
  ],
  "moejax/train/step.py": ["tests/train/test_schedule.py"],
  "moejax/sharding.py": ["tests/sharding/test_rules.py"],
  # post-training: pruning, surgery, the method scores, quantizers, decompositions
  "moejax/posttrain/prune.py": [
    "tests/posttrain/test_prune.py",
    "tests/posttrain/test_atom_removal_bounds.py::test_the_atom_pruning_report_counts_experts_and_their_kept_atoms",
    "tests/posttrain/test_prune_workdir.py::test_keep_as_fraction_or_count",
    "tests/posttrain/test_prune_workdir.py::test_most_similar_kept_expert_by_cosine_of_the_gram",
    "tests/posttrain/test_expert_subset.py::test_knee_budgets_follow_each_layers_own_curve",
    "tests/posttrain/test_surgery.py::test_step_no_merge_keeps_steps_experts_and_only_removes_the_rest",
    "tests/posttrain/test_surgery.py::test_merge_partners_by_output_find_a_functional_twin_the_gram_cannot",
    "tests/posttrain/test_surgery.py::test_deployed_error_equals_a_numpy_moe_and_the_proxy_where_nothing_re_routes",
  ],
  "moejax/posttrain/surgery.py": ["tests/posttrain/test_surgery.py"],
  "moejax/posttrain/expert_subset.py": ["tests/posttrain/test_expert_subset.py"],
  "moejax/posttrain/taylor.py": [
    "tests/posttrain/test_taylor_selection.py",
    "tests/posttrain/test_taylor.py",
  ],
  "moejax/posttrain/atoms.py": [
    "tests/posttrain/test_atom_removal_bounds.py",
    "tests/posttrain/test_atoms.py",
  ],
  "moejax/posttrain/quantize.py": ["tests/posttrain/test_quantize.py"],
  "moejax/posttrain/gemq.py": ["tests/posttrain/test_gemq.py"],
  "moejax/posttrain/codebook.py": ["tests/posttrain/test_codebook.py"],
  "moejax/posttrain/tucker.py": [
    "tests/posttrain/test_tucker_spectra.py",
    "tests/posttrain/test_tucker.py",
  ],
  # mixtures and online learning
  "moejax/mixtures/kmeans.py": ["tests/mixtures/test_kmeans_hartigan.py"],
  "moejax/mixtures/score_mixture.py": ["tests/mixtures/test_score_mixture.py"],
  "moejax/mixtures/fedgem.py": ["tests/mixtures/test_fedgem.py"],
  "moejax/online/ace.py": ["tests/online/test_ace.py"],
  "moejax/online/tmow.py": ["tests/online/test_tmow.py"],
  # analyses (super_experts' study-level run is too slow; router_inference keeps two
  # studies, the only callers of the held-out workdir's windows and plays)
  "moejax/analysis/super_experts.py": [
    f"tests/analysis/test_super_experts.py::{name}"
    for name in (
      "test_thresholds_on_hand_made_peaks",
      "test_the_official_rule_and_the_massive_layers_guess_disagree_by_hand",
      "test_the_official_rule_names_block_3_expert_6_on_the_committed_zoo_s_profile",
      "test_peaks_equal_a_brute_force_loop_over_routed_tokens",
      "test_a_planted_super_expert_is_found_exactly",
      "test_attention_sink_mass_by_hand_and_a_planted_sink",
      "test_massive_activations_find_a_planted_outlier",
      "test_ablation_removes_exactly_the_routed_contributions_of_the_expert",
      "test_study_arm_sizes_and_the_most_frequent_arm_by_hand",
      "test_massive_layer_defaults_at_their_boundaries",
      "test_uniform_sink_mass_by_hand",
    )
  ],
  "moejax/analysis/repetition.py": ["tests/analysis/test_repetition.py"],
  "moejax/analysis/routing_attribution.py": ["tests/analysis/test_routing_attribution.py"],
  "moejax/analysis/router_inference.py": [
    f"tests/analysis/test_router_inference.py::{name}"
    for name in (
      "test_teacher_forced_decoding_equals_the_full_forward",
      "test_score_batches_reports_loss_and_top_k_load",
      "test_calibration_captures_moe_inputs_and_finds_duplicate_experts",
      "test_set_router_state_writes_each_layer_and_checks_the_count",
      "test_sere_decoding_with_a_threshold_above_every_similarity_is_top_k",
      "test_decode_windows_are_the_validation_stream_and_refuse_one_token_too_many",
      "test_sere_study_decodes_windows_of_draw_d",  # decode_windows
      "test_as_coot_study_scores_held_out_play_d_on_draw_d",
    )
  ],  # play_batches
  "moejax/evaluation/stats.py": ["tests/evaluation/test_stats.py"],
}

SWAP_BINOP = {
  ast.Add: ast.Sub,
  ast.Sub: ast.Add,
  ast.Mult: ast.Div,
  ast.Div: ast.Mult,
  ast.FloorDiv: ast.Div,
  ast.Mod: ast.FloorDiv,
}
SWAP_CMP = {
  ast.Lt: ast.LtE,
  ast.LtE: ast.Lt,
  ast.Gt: ast.GtE,
  ast.GtE: ast.Gt,
  ast.Eq: ast.NotEq,
  ast.NotEq: ast.Eq,
}


@dataclasses.dataclass
class Mutant:
  path: str
  line: int
  kind: str
  before: str
  after: str
  start: tuple  # (lineno, col)
  end: tuple


def docstring_nodes(tree):
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        out.add(id(body[0].value))
  return out


def mutations(node, parent_seq):
  """(kind, new_node) pairs for one AST node."""
  import copy

  out = []
  if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BINOP:
    m = copy.deepcopy(node)
    m.op = SWAP_BINOP[type(node.op)]()
    out.append(("binop", m))
    if isinstance(node.op, (ast.Add, ast.Sub)):
      out.append(("drop", copy.deepcopy(node.left)))
  elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_CMP:
    m = copy.deepcopy(node)
    m.ops = [SWAP_CMP[type(node.ops[0])]()]
    out.append(("compare", m))
  elif isinstance(node, ast.Constant) and not isinstance(node.value, str):
    if isinstance(node.value, bool):
      out.append(("const", ast.Constant(not node.value)))
    elif isinstance(node.value, int):
      out.append(("const", ast.Constant(node.value + 1)))
    elif isinstance(node.value, float):
      out.append(("const", ast.Constant(node.value * 2 if node.value else 1.0)))
  elif isinstance(node, ast.Constant) and isinstance(node.value, str) and parent_seq:
    # the next name of the file's pool of tuple-held strings that shares a tuple with
    # this one somewhere (mesh axis -> another mesh axis), else the next in the pool
    pool, siblings = parent_seq
    near = sorted(siblings.get(node.value, set()) - {node.value}) or sorted(pool - {node.value})
    if near:
      out.append(("string", ast.Constant(near[0])))
  elif (
    isinstance(node, ast.Call)
    and len(node.args) == 2
    and not node.keywords
    and not any(isinstance(a, ast.Starred) for a in node.args)
  ):
    m = copy.deepcopy(node)
    m.args = m.args[::-1]
    out.append(("swap", m))
  elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
    out.append(("unary", copy.deepcopy(node.operand)))
  return out


def candidates(path, source):
  tree = ast.parse(source)
  skip = docstring_nodes(tree)
  seq_of, pool, siblings = {}, set(), {}
  for node in ast.walk(tree):
    if isinstance(node, (ast.Tuple, ast.List)):
      names = {
        e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
      }
      pool |= names
      for e in node.elts:
        seq_of[id(e)] = node
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
          siblings.setdefault(e.value, set()).update(names)
  lines = source.splitlines(keepends=True)
  out = []
  for node in ast.walk(tree):
    if id(node) in skip or not hasattr(node, "lineno") or node.end_lineno is None:
      continue
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in seq_of:
      continue
    for kind, new in mutations(node, (pool, siblings) if id(node) in seq_of else None):
      before = ast.get_source_segment(source, node)
      after = ast.unparse(new)
      if before is None or after == before:
        continue
      out.append(
        Mutant(
          path,
          node.lineno,
          kind,
          before,
          after,
          (node.lineno, node.col_offset),
          (node.end_lineno, node.end_col_offset),
        )
      )
  out.sort(key=lambda m: (m.start, m.kind))
  del lines
  return out


def apply(source, m):
  lines = source.splitlines(keepends=True)

  def offset(pos):
    row, column = pos
    return sum(len(line) for line in lines[: row - 1]) + len(
      lines[row - 1].encode()[:column].decode()
    )

  a, b = offset(m.start), offset(m.end)
  after = m.after if m.start[0] == m.end[0] else f"({m.after})"
  if m.start[0] == m.end[0] and "\n" not in after:
    after = f"({after})" if m.kind in ("binop", "drop", "unary", "compare") else after
  return source[:a] + after + source[b:]


def spread(items, n):
  if len(items) <= n:
    return items
  return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]


class Timeout(Exception):
  pass


def forget_dataset_builders(modules):
  """Unregister the TFDS builders the dropped `modules` defined: re-importing
  moejax.data.shakespeare would otherwise raise 'Dataset ... already registered'
  (pytest exit status 4, which is not a killed mutant)."""
  registered = sys.modules.get("tensorflow_datasets.core.registered")
  if registered is None:
    return
  for name, cls in list(registered._DATASET_REGISTRY.items()):
    if cls.__module__ in modules:
      del registered._DATASET_REGISTRY[name]
  for module in modules:
    registered._MODULE_TO_DATASETS.pop(module, None)


def run_tests_in_process(tree, tests, timeout):
  """pytest.main in this process (JAX, and the per-shape compilations of eager ops,
  are loaded once for all mutants): every module loaded from the copy (moejax,
  tests, conftests, test modules) is dropped from sys.modules first, so the
  mutated source is what gets imported."""
  import pytest

  root = os.path.realpath(tree) + os.sep
  dropped = set()
  for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None) or ""
    if os.path.realpath(path).startswith(root):  # moejax, tests, conftests, test modules
      del sys.modules[name]
      dropped.add(name)
  forget_dataset_builders(dropped)

  def alarm(*_):
    raise Timeout()

  signal.signal(signal.SIGALRM, alarm)
  signal.alarm(int(timeout))
  t0 = time.time()
  try:
    rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *tests])
  except Timeout:
    rc = "timeout"
  finally:
    signal.alarm(0)
  return int(rc) if rc != "timeout" else rc, "", time.time() - t0


def drop_bytecode(full):
  """Remove the cached bytecode of `full`: a mutant of the same size written within
  the same second as the cached source would otherwise run the stale .pyc."""
  import glob

  stem = os.path.splitext(os.path.basename(full))[0]
  for pyc in glob.glob(os.path.join(os.path.dirname(full), "__pycache__", f"{stem}.*.pyc")):
    os.remove(pyc)


def run_tests(tree, tests, timeout, python):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
  cmd = [
    "nice",
    "-n",
    "10",
    python,
    "-m",
    "pytest",
    "-x",
    "-q",
    "-p",
    "no:cacheprovider",
    "-W",
    "ignore",
    *tests,
  ]
  t0 = time.time()
  try:
    proc = subprocess.run(
      cmd,
      cwd=tree,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      timeout=timeout,
    )
    return proc.returncode, proc.stdout[-1500:], time.time() - t0
  except subprocess.TimeoutExpired:
    return "timeout", "", time.time() - t0


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tree", required=True, help="a copy of the repo to mutate (not your checkout)")
  ap.add_argument("--max_per_file", type=int, default=16)
  ap.add_argument(
    "--only",
    default="",
    help="comma-separated substrings of the module paths to mutate (any matches)",
  )
  ap.add_argument("--timeout", type=float, default=600)
  ap.add_argument("--out", default="mutation_results.json")
  ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
  ap.add_argument(
    "--survivors_of",
    default="",
    help="a results file (--out) of an earlier run: run only its survivors "
    "(after tests were added; the killed stay killed)",
  )
  ap.add_argument("--python", default=sys.executable)
  ap.add_argument(
    "--in_process",
    action="store_true",
    help="run pytest inside this process (start it with cwd=--tree and "
    "PYTHONPATH=--tree); much faster for eager-JAX tests",
  )
  args = ap.parse_args()
  tree = os.path.abspath(args.tree)
  if os.path.exists(os.path.join(tree, ".git")) and os.path.samefile(
    tree, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  ):
    sys.exit("refusing to mutate the checkout this script lives in: pass a copy (--tree)")
  sys.dont_write_bytecode = True
  if args.in_process:
    os.environ["JAX_PLATFORMS"] = "cpu"
    if os.path.realpath(os.getcwd()) != os.path.realpath(tree):
      sys.exit("--in_process: run from inside the copy (cd TREE; PYTHONPATH=TREE python ...)")
    import moejax

    if not os.path.realpath(moejax.__file__).startswith(os.path.realpath(tree)):
      sys.exit(f"the copy's moejax is not the one imported: {moejax.__file__}")
  check = subprocess.run(
    [args.python, "-c", "import moejax; print(moejax.__file__)"],
    cwd=tree,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=tree),
    capture_output=True,
    text=True,
  )
  if not check.stdout.strip().startswith(tree):
    sys.exit(f"the copy's moejax is not the one imported: {check.stdout}{check.stderr}")
  # SIGTERM: restore the mutated file and exit at once (pytest would swallow an
  # exception raised inside pytest.main and carry on).
  current = {}

  def stop(*_):
    if current:
      with open(current["full"], "w") as f:
        f.write(current["source"])
      drop_bytecode(current["full"])
    os._exit(143)

  signal.signal(signal.SIGTERM, stop)
  survivors = None
  if args.survivors_of:
    with open(args.survivors_of) as f:
      survivors = {
        (r["path"], r["line"], r["kind"], r["before"], r["after"])
        for r in json.load(f)
        if r["status"] == "survived"
      }
  results = []
  only = args.only.split(",")
  for path, tests in TARGETS.items():
    if not any(part in path for part in only):
      continue
    full = os.path.join(tree, path)
    source = open(full).read()
    committed = subprocess.run(
      ["git", "show", f"HEAD:{path}"], cwd=tree, capture_output=True, text=True
    ).stdout
    if source != committed:
      sys.exit(
        f"{full} differs from the copy's HEAD (a mutant left behind?): "
        f"`git -C {tree} checkout {path}` first"
      )
    current.update(full=full, source=source)
    chosen = spread(candidates(path, source), args.max_per_file)
    if survivors is not None:
      chosen = [m for m in chosen if (path, m.line, m.kind, m.before, m.after) in survivors]
    for m in chosen:
      if args.list:
        print(f"{path}:{m.line} {m.kind}: {m.before!r} -> {m.after!r}")
        continue
      mutated = apply(source, m)
      try:
        ast.parse(mutated)
      except SyntaxError:
        continue
      try:
        with open(full, "w") as f:
          f.write(mutated)
        drop_bytecode(full)
        if args.in_process:
          rc, tail, seconds = run_tests_in_process(tree, tests, args.timeout)
        else:
          rc, tail, seconds = run_tests(tree, tests, args.timeout, args.python)
      finally:
        with open(full, "w") as f:
          f.write(source)
        drop_bytecode(full)
      # pytest: 0 passed, 1 failed, 2 interrupted (a collection error: the mutant broke an
      # import), 3 internal error, 4 usage error (a conftest that cannot load), 5 no tests
      status = {0: "survived", 3: "error", 4: "error", 5: "no tests"}.get(rc, "killed")
      results.append(
        dict(
          path=path,
          line=m.line,
          kind=m.kind,
          before=m.before,
          after=m.after,
          status=status,
          rc=rc,
          seconds=round(seconds, 1),
          tail="" if rc == 0 else tail.splitlines()[-1:],
        )
      )
      print(
        f"{status:8s} {path}:{m.line} {m.kind}: {m.before!r} -> {m.after!r} ({seconds:.0f} s)",
        flush=True,
      )
      with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
  if args.list:
    return
  by = {}
  for r in results:
    if r["status"] in ("error", "no tests"):
      print(f"not counted ({r['status']}): {r['path']}:{r['line']}")
      continue
    k = by.setdefault(r["path"], [0, 0])
    k[0] += r["status"] == "killed"
    k[1] += 1
  for path, (killed, total) in by.items():
    print(f"{path}: {killed}/{total} killed")
  total = sum(t for _, t in by.values())
  print(f"score: {sum(k for k, _ in by.values())}/{total}")


if __name__ == "__main__":
  main()
