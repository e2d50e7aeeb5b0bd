"""The pruning study's table (moejax/posttrain/study.py): paired differences over
calibration draws against the reference method and the unpruned model, by hand."""
from moejax.posttrain import study


def scores(bpb, nbytes=100):
  return {"bpb": {"all": bpb}, "probes": {"facts": {"all": {"accuracy": 0.5, "n": 2}}},
          "parameter_bytes": nbytes}


def test_table_gives_paired_t_intervals_over_draws():
  runs = [{"keep": "0.5", "method": m, "draw": d, "scores": scores(v, 60)}
          for m, values in (("frequency", (3.0, 3.2)), ("schur_astar", (2.8, 3.1)))
          for d, v in enumerate(values)]
  result = {"runs": runs, "reference": "frequency", "keeps": ["0.5"],
            "methods": ["schur_astar", "frequency"], "unpruned": scores(2.5)}
  table = study.summary_table(result)
  # differences -0.2, -0.1: mean -0.15, std 0.0707, t(0.975, 1) = 12.706
  assert "| 0.5 | schur_astar | 2.9500 | -0.1500 ± 0.0707 [-0.7853, +0.4853] |" in table
  assert "| 0.5 | frequency | 3.1000 | — | +0.6000 ± 0.1414 [-0.6706, +1.8706] |" in table
  assert "| all | unpruned | 2.5000 | — | — | 0.500 | 100 |" in table


def test_claims_table_gives_the_verdict_in_the_papers_direction():
  # per draw: schur_astar - frequency = -0.2, -0.21, -0.19 (mean -0.2, std 0.01,
  # t(0.975, 2) = 4.3027: half width 0.0248); step - frequency the mirror image
  values = {"frequency": (3.0, 3.0, 3.0), "schur_astar": (2.8, 2.79, 2.81),
            "step": (3.2, 3.21, 3.19)}
  runs = [{"keep": "0.5", "method": m, "draw": d, "scores": scores(v)}
          for m, vs in values.items() for d, v in enumerate(vs)]
  result = {"runs": runs, "keeps": ["0.5"]}
  table = study.claims_table(result)
  assert ("| schur_astar - frequency | -0.2000 ± 0.0100 [-0.2248, -0.1752] | reproduces |"
          in table)
  assert "| step - frequency | +0.2000 ± 0.0100 [+0.1752, +0.2248] | opposite direction |" in table
  assert "greedy" not in table and "heapr" not in table  # claims without both arms are left out


def test_compression_tables_pair_only_the_draws_every_arm_has_run():
  from moejax.posttrain import compress_study
  arms = ("svd", "whitened_svd", "tucker", "td_moe")
  runs = [{"level": "0.4", "method": m, "draw": d, "scores": scores(3.0 - 0.1 * i - 0.01 * d)}
          for d in (0, 1, 2) for i, m in enumerate(arms) if d < 2 or m == "svd"]
  for r in runs:
    r["scores"].update(rerouted=0.1, expert_parameters=10, checkpoint_bytes=20)
  result = {"table": "td_moe", "methods": list(arms), "levels": ["0.4"], "runs": runs,
            "reference": "svd", "uncompressed": scores(2.5), "bytes_per_domain": 8}
  assert compress_study.complete_draws(result)["complete_draws"] == [0, 1]
  text = compress_study.tables(result)
  assert "Paired over 2 calibration draws (seeds [0, 1])" in text
  # td_moe - svd = -0.3 on both draws: std 0, so the interval is the point
  assert "| 0.4 | TD-MoE beats per-expert SVD | td_moe - svd | -0.3000 ± 0.0000" in text
