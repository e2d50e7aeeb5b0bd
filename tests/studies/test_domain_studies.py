"""The MergeMix and overtrained-experts studies (moejax/studies/scorers/mergemix.py,
overtrained_experts.py) on a tiny untrained MoE over a fixture mix corpus: each
figure equals the library calls it stands for (a trained mixture, Spearman by
scipy, the base's own-domain loss at step 0), and bad settings are refused naming
their key before any run."""

import numpy as np
import pytest
import scipy.stats

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.configs.studies import mergemix as mergemix_study
from moejax.configs.studies import overtrained_experts as overtrained_study
from moejax.errors import ConfigError
from moejax.studies import runner
from tests.helpers import training_workdir
from tests.data.mix_fixtures import fixture_sources

DOMAINS = ["drama", "code"]
SMALL = {"domains": DOMAINS, "batch": 2, "warmup": 1, "bytes_per_domain": 1024}
BASE = {"step": 0, "seq_len": 0}  # the workdir's latest checkpoint and its seq_len


@pytest.fixture(scope="module")
def mix_workdir(tmp_path_factory):
  """A step-0 tiny MoE whose run trained on a fixture mix corpus (seq_len 32)."""
  from moejax.data import mix

  root = tmp_path_factory.mktemp("domain_studies")
  data_dir = str(root / "tfds")
  mix.prepare_mix(data_dir, fixture_sources(root / "sources"))
  config = get_config("size=tiny")
  config.data.name, config.data.data_dir, config.data.seq_len = "mix", data_dir, 32
  workdir = str(root / "base")
  training_workdir(workdir, config)
  return workdir


def study(module, workdir, **settings):
  config = module.get_config()
  config.settings.update({"workdir": workdir, **SMALL, **BASE, **settings})
  config.draws = 1
  return config


def run(config, out):
  spec, scorer = runner.prepare(config)
  results = runner.run(spec, scorer, str(out), plot=False, log=lambda _: None)
  return {(r["arm"], *r["level"].values()): r["metrics"] for r in results["runs"]}, scorer


@pytest.mark.integration
def test_mergemix_figures_are_the_library_calls(mix_workdir, tmp_path):
  from moejax.posttrain.domain_finetune import mixture_batches, window_nats

  config = study(mergemix_study, mix_workdir, steps=2, mixtures=3, resolution=2)
  config.levels = [{"target": "mean"}, {"target": "speeches"}]
  got, scorer = run(config, tmp_path)
  proxy = got[("proxy", "mean")]
  pairs = [[proxy[f"{kind}_loss/{i}"] for i in range(3)] for kind in ("proxy", "trained")]
  assert proxy["spearman"] == pytest.approx(scipy.stats.spearmanr(*pairs).statistic, abs=1e-12)
  assert got[("uniform", "mean")]["loss"] == pairs[1][0]
  assert got[("best_trained", "speeches")]["loss"] <= got[("uniform", "speeches")]["loss"]
  weights = [got[("proxy_best", "mean")][f"weight/{d}"] for d in DOMAINS]
  assert sorted(weights) in ([0.0, 1.0], [0.5, 0.5])  # a point of the grid of step 1/2
  # the uniform mixture trained by hand
  src, data = scorer.source, scorer.data
  batches = mixture_batches(scorer.streams, [0.5, 0.5], 2, 2, data.seq_len, seed=0)
  params, rest = scorer.finetuner.run(src.params, src.rest, batches, seed=0)[2]
  want = np.mean(
    [np.mean(window_nats(scorer.graphdef, params, rest, data.held_out[d][1::2])) for d in DOMAINS]
  )
  assert got[("uniform", "mean")]["loss"] == pytest.approx(want, rel=1e-6)


@pytest.mark.integration
def test_overtrained_experts_curves_start_at_the_base(mix_workdir, tmp_path):
  config = study(
    overtrained_study, mix_workdir, steps=4, checkpoint_every=2, early=2, pool=4, scales=[0.5, 1.0]
  )
  got, _ = run(config, tmp_path)
  for merge in ("task_arithmetic", "ties"):
    experts, merged = got[("experts_final", merge)], got[("merged_final", merge)]
    assert experts["loss@0"] == got[("base", merge)]["loss"]
    assert experts["loss@4"] == experts["loss"] and merged["loss@4"] == merged["loss"]
    assert got[("merged_early", merge)]["loss"] == merged["loss@2"]
    assert got[("merged_peak", merge)]["peak_fraction"] in (0.5, 1.0)
    assert merged["scale@2"] in (0.5, 1.0)
    assert {got[("merged_stopped", merge)][f"stop/{d}"] for d in DOMAINS} <= {2.0, 4.0}
    assert 0 <= merged["late_fraction"] <= 1


@pytest.mark.parametrize(
  "module, settings, message",
  [
    (
      mergemix_study,
      {"domains": ["drama"] * 7},
      r"asks for K=7 experts, but the corpus has only N=6",
    ),
    (mergemix_study, {"domains": ["drama", "poems"]}, r"'poems' is not a domain of the corpus"),
    (mergemix_study, {"mixtures": 2}, r"study.settings.mixtures=2 must be >= 3"),
    (mergemix_study, {"steps": 0}, r"study.settings.steps=0 must be an integer >= 1"),
    (mergemix_study, {"learning_rate": -1.0}, r"study.settings.learning_rate=-1.0 must be"),
    (mergemix_study, {"step": 120}, r"study.settings.step=120 is not a checkpoint of .*\[0\]"),
    (mergemix_study, {"seq_len": -1}, r"study.settings.seq_len=-1 must be an integer >= 0"),
    (overtrained_study, {"early": 240}, r"early=240 a checkpoint before the last"),
    (overtrained_study, {"scales": []}, r"study.settings.scales=\[\] must be a list"),
  ],
)
def test_bad_settings_are_refused_before_any_run(mix_workdir, module, settings, message):
  config = module.get_config()
  config.settings.update({"workdir": mix_workdir, **BASE, **settings})
  with pytest.raises(ConfigError, match=message):
    runner.prepare(config)


def test_a_base_not_trained_on_the_mix_corpus_is_refused(tmp_path):
  workdir = str(tmp_path / "shakespeare")
  training_workdir(workdir)
  config = mergemix_study.get_config()
  config.settings.update({"workdir": workdir, **BASE})
  with pytest.raises(ConfigError, match=r"trained on data.name='shakespeare'.*mix corpus"):
    runner.prepare(config)
  config.levels = [{"target": "poems"}]
  config.settings.workdir = "/nonexistent"
  with pytest.raises(ConfigError, match=r"study.settings.workdir=/nonexistent"):
    runner.prepare(config)


def test_too_few_held_out_windows_are_refused(mix_workdir):
  _, scorer = runner.prepare(study(mergemix_study, mix_workdir, bytes_per_domain=40))
  with pytest.raises(
    ConfigError, match=r"bytes_per_domain=40 gives domain 'drama' fewer than 2 held-out windows"
  ):
    scorer.data
