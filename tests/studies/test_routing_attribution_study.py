"""The routing-attribution study (moejax/studies/scorers/routing_attribution.py) on the
tiny trained LM (two MoE blocks, two heads each): each run's flip rate is the
library's ablation and routed sets recomputed by hand, the arms remove the components
the decomposition ranks, the headline share is the decomposition's, and bad settings
are refused naming their key before any run."""

import numpy as np
import pytest

from moejax.analysis import routing_attribution as ra
from moejax.analysis.phenomena import HeldOut
from moejax.analysis.super_experts import model_of
from moejax.configs.studies import routing_attribution as study
from moejax.errors import ConfigError
from moejax.studies import runner


def config_for(workdir, **settings):
  c = study.get_config()
  c.settings.workdir = workdir
  c.settings.n = 1
  for key, value in settings.items():
    c.settings[key] = value
  c.draws = 1
  return c


@pytest.mark.integration
def test_runs_are_the_ablations_they_stand_for(tiny_workdir, tmp_path):
  _, workdir = tiny_workdir
  spec, scorer = runner.prepare(config_for(workdir))
  results = runner.run(spec, scorer, str(tmp_path / "out"), plot=False, log=lambda _: None)
  runs = {r["arm"]: r["metrics"] for r in results["runs"]}

  held = HeldOut.load(workdir)
  _, graphdef, params, rest = model_of((held.config, held.params, held.rest))
  _, windows, _ = held.windows(0, 512)
  layers = ra.attribute(graphdef, params, rest, windows)
  before = ra.routed_sets(graphdef, params, rest, windows)
  cfg = held.config.model
  for arm, pick in (("top", np.argmax), ("bottom", np.argmin)):
    flips = []
    for index, layer in enumerate(layers):
      candidates = [n for n in layer["names"] if ".head" in n or ".expert" in n]
      influence = [layer["influence"][layer["names"].index(n)] for n in candidates]
      name = candidates[int(pick(influence))]
      after = ra.routed_sets(graphdef, ra.ablate_component(cfg, params, name), rest, windows)
      flips.append(np.mean(np.any(after[index] != before[index], axis=-1)))
    np.testing.assert_allclose(runs[arm]["flip_rate"], np.mean(flips), rtol=1e-12)
  second = layers[1]
  by_source = ra.influence_by_source(second)
  total = sum(by_source.values())
  moe = sum(v for k, v in by_source.items() if k == "moe0")
  attention = sum(v for k, v in by_source.items() if k.startswith("attn"))
  np.testing.assert_allclose(
    runs["top"]["moe_minus_attention"], (moe - attention) / total, rtol=1e-6
  )
  assert 0.0 <= runs["top"]["moe_share_recursive"] <= 1.0
  assert (
    runs["top"]["ablated_share"]
    >= runs["random"]["ablated_share"]
    >= runs["bottom"]["ablated_share"]
  )


@pytest.mark.parametrize(
  "settings, message",
  [
    ({"n": 3}, "study.settings.n=3 must be at most 2"),
    ({"n": 0}, "study.settings.n=0 must be an integer >= 1"),
    ({"bytes_per_domain": 0}, "study.settings.bytes_per_domain=0"),
  ],
)
def test_bad_settings_are_refused_naming_the_key(tiny_workdir, settings, message):
  _, workdir = tiny_workdir
  with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
    runner.prepare(config_for(workdir, **settings))


def test_a_bad_arm_is_refused_naming_it(tiny_workdir):
  _, workdir = tiny_workdir
  c = config_for(workdir)
  c.arms = [{"name": "top", "ablate": "largest"}]
  c.reference = "top"
  c.claims = []
  with pytest.raises(ConfigError, match=r"study.arms\[0\].ablate='largest' \(arm 'top'\)"):
    runner.prepare(c)
