"""Multi-seed sweeps (issue 13, part 4): t quantiles, paired intervals, verdicts,
seed checks, and a 2-arm x 2-seed sweep through run_sweep and its report."""
import math
import os

import ml_collections
import pytest

from moejax.errors import ConfigError
from moejax.train import seed_stats
from moejax.train import sweep as sweep_lib
from moejax.train.sweep_report import plot_curves, seed_table
from tests.train.test_sweep import MOE, FakeTrain


@pytest.mark.parametrize("df, quantile", [
    (1, 12.706204736174698), (2, 4.302652729749464), (3, 3.182446305284263),
    (4, 2.7764451051977934), (9, 2.2621571627982053), (30, 2.0422724563012373)])
def test_t_quantile_matches_tables(df, quantile):
  assert seed_stats.t_quantile(0.975, df) == pytest.approx(quantile, rel=1e-12)


def test_t_cdf_closed_forms():
  # df=1 is Cauchy: P(|T| <= 1) = 1/2; df=2: P(|T| <= t) = t / sqrt(2 + t^2).
  assert seed_stats.t_abs_cdf(1.0, 1) == pytest.approx(0.5, abs=1e-15)
  assert seed_stats.t_abs_cdf(3.0, 2) == pytest.approx(3 / math.sqrt(11), abs=1e-15)


def test_paired_interval_by_hand():
  diff = seed_stats.paired_difference([3.0, 5.0, 7.0], [2.0, 3.0, 4.0])  # d = 1, 2, 3
  half = 4.302652729749464 / math.sqrt(3)  # t_{0.975,2} * sd 1 / sqrt(3)
  assert (diff.n, diff.mean, diff.std) == (3, 2.0, 1.0)
  assert (diff.lo, diff.hi) == pytest.approx((2 - half, 2 + half), abs=1e-12)
  one = seed_stats.paired_difference([3.0], [2.5])
  assert (one.mean, one.std, one.lo, one.hi) == (0.5, None, None, None)


def test_verdicts():
  lower = seed_stats.paired_difference([1.0, 1.1, 0.9], [2.0, 2.0, 2.0])  # d ~ -1, tight
  assert seed_stats.verdict(lower, "lower") == "reproduces"
  assert seed_stats.verdict(lower, "higher") == "opposite direction"
  assert seed_stats.verdict(lower, None) == "differs (lower)"
  # d = 1, 2, 3: interval [-0.48, 4.48] holds 0; |delta| < 4.48
  mixed = seed_stats.paired_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
  assert seed_stats.verdict(mixed, "higher") == "no detectable difference (|delta| < 4.48)"
  assert seed_stats.verdict(seed_stats.paired_difference([1.0], [0.0]), "lower") == \
      "interval undefined (n=1 seed)"
  same = seed_stats.paired_difference([2.5, 2.7], [2.5, 2.7])
  assert seed_stats.verdict(same, "lower") == "identical on all 2 seeds"
  with pytest.raises(ConfigError, match="expect='down'"):
    seed_stats.verdict(lower, "down")


@pytest.mark.parametrize("seeds, message", [
    ([0, 1, 0], r"seeds=\[0, 1, 0\] gives seed 0 twice"),
    ([], r"seeds=\(\) is empty"),
    ([0, 1.5], r"seeds=\[0, 1.5\] must be ints"),
    ("01", r"seeds='01' must be a list")])
def test_bad_seeds_fail_before_anything_is_written(tmp_path, seeds, message):
  sweep = multi_seed_sweep(seeds)
  fake = FakeTrain()
  with pytest.raises(ConfigError, match=message):
    sweep_lib.run_sweep(sweep, str(tmp_path / "out"), train_fn=fake, log=id)
  assert fake.calls == [] and not os.path.exists(tmp_path / "out")


def multi_seed_sweep(seeds, variants=None):
  c = ml_collections.ConfigDict()
  c.title, c.steps, c.seeds = "seeds", 3, seeds
  c.common = ("train.eval_every=2",)
  c.variants = variants or (("top2", MOE + ":size=tiny", ()),
                            ("top1", MOE + ":size=tiny", ("model.moe.top_k=1",), "lower"))
  return c


def test_seed_or_seeds_and_no_seed_override():
  both = multi_seed_sweep([0, 1])
  both.seed = 0
  with pytest.raises(ConfigError, match="both set"):
    sweep_lib.run_sweep(both, "/nonexistent", train_fn=FakeTrain(), log=id)
  with pytest.raises(ConfigError, match="'s' overrides seed"):
    sweep_lib.variants_of(multi_seed_sweep([0, 1], (("s", MOE, ("seed=1",)),)))
  with pytest.raises(ConfigError, match="expect='down'"):
    sweep_lib.variants_of(multi_seed_sweep([0], (("s", MOE, (), "down"),)))


class SeededFake(FakeTrain):
  """val bpb = 2 + top_k/10 + seed/100: top-1 is 0.1 lower on every seed."""

  def __call__(self, config, run_dir):
    run = super().__call__(config, run_dir)
    run.eval["val_bpb"] += config.seed / 100 + (config.seed == 5) * 1e-3 * config.model.moe.top_k
    return run


def test_two_arms_two_seeds_pair_by_seed_and_plot_every_run(tmp_path):
  fake = SeededFake()
  results = sweep_lib.run_sweep(multi_seed_sweep([5, 7]), str(tmp_path), train_fn=fake, log=id)
  assert fake.calls == ["seed_5", "seed_5", "seed_7", "seed_7"]  # seed by seed
  assert [(r["name"], r["seed"]) for r in results] == [
      ("top2", 5), ("top1", 5), ("top2", 7), ("top1", 7)]
  configs = {(r["name"], r["seed"]): r["config"] for r in results}
  for seed in (5, 7):  # same seed, same data order: only the routing differs
    a, b = configs["top2", seed], configs["top1", seed]
    assert {k for k in a if a[k] != b[k]} == {"model.moe.top_k"} and a["seed"] == seed
  table = seed_table(results)
  # top2: 2.252, 2.270 (sd 0.018/sqrt2); top1: 2.151, 2.170 (sd 0.019/sqrt2);
  # d = -0.101 (seed 5), -0.100 (seed 7): mean -0.1005, sd 0.001/sqrt2 = 0.000707
  half = 12.706204736174698 * 0.001 / math.sqrt(2) / math.sqrt(2)
  row = [line for line in table.splitlines() if line.startswith("| top1 ")][0]
  assert (f"| top1 | 5,7 | 2.1605 ± 0.0134 | -0.1005 ± 0.0007 | "
          f"[{-0.1005 - half:+.4f}, {-0.1005 + half:+.4f}] | lower | reproduces |") == row
  assert "| top2 | 5,7 | 2.2610 ± 0.0127 | — | — | — | baseline |" in table
  again = sweep_lib.run_sweep(multi_seed_sweep([5, 7]), str(tmp_path), train_fn=fake, log=id)
  assert len(fake.calls) == 4 and [r["val_bpb"] for r in again] == [r["val_bpb"] for r in results]
  one_seed = seed_table([r for r in results if r["seed"] == 5])
  assert "undefined (n=1) | lower | interval undefined (n=1 seed) |" in one_seed
  png = tmp_path / "curves.png"
  plot_curves(results, str(png))
  assert png.stat().st_size > 10_000


def test_the_five_seed_router_sweep_pairs_arms_by_seed():
  from moejax.configs.ablations import routers_seeds
  sweep = routers_seeds.get_config()
  assert sweep_lib.sweep_seeds(sweep) == (0, 1, 2, 3, 4)
  variants = {v.name: v for v in sweep_lib.variants_of(sweep)}
  assert variants["topk"].expect is None and variants["dpsl"].expect == "lower"
  top = sweep_lib.fingerprint(sweep_lib.variant_config(sweep, variants["topk"], 3).to_dict())
  dpsl = sweep_lib.fingerprint(sweep_lib.variant_config(sweep, variants["dpsl"], 3).to_dict())
  assert {k for k in top.keys() | dpsl.keys() if top.get(k) != dpsl.get(k)} == {
      "model.moe.loss_weights.dpsl"} and top["seed"] == 3
