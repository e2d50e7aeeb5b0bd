"""The repetition_curse study (configs/studies/repetition_curse.py) on a fresh tiny MoE
workdir: each arm's prompts by hand (attack_prompts), its figures against
moejax/analysis/repetition.py on those prompts, and the identity case flagged."""

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.analysis import repetition as rep
from moejax.dispatch.capacity import expert_capacity
from moejax.errors import ConfigError
from moejax.studies import runner
from moejax.train.restore import load_from_workdir
from moejax.train.sweep import load_config_file
from tests.evaluation.domain_texts import tiny_domains_workdir


@pytest.fixture(scope="module")
def area(tmp_path_factory):
  root = tmp_path_factory.mktemp("repetition")
  tiny_domains_workdir(root, root / "w")
  return root


def study(area, **settings):
  c = load_config_file("configs/studies/repetition_curse.py")
  c.settings = {
    "workdir": f"{area}/w",
    "length": 12,
    "num_prompts": 2,
    "bytes_per_domain": 64,
    "prefix_text": "A ",
    "chat_open": "U:",
    "chat_close": "B",
    "pattern": 2,
    "prefill_repeats": 1,
    **settings,
  }
  c.draws = 1
  return c


def test_each_arm_is_its_prompts_scored_by_hand(area):
  spec, scorer = runner.prepare(study(area))
  results = runner.run(spec, scorer, str(area / "out"), plot=False, log=lambda _: None)
  runs = {r["arm"]: r["metrics"] for r in results["runs"]}
  config, graphdef, params, rest, _ = load_from_workdir(f"{area}/w", for_generation=True)
  moe = config.model.moe
  ids = np.random.default_rng(0).integers(32, 127, 4)
  prefix = [0, 65, 32]  # separator, "A "
  prompts = {
    "repeated": rep.attack_prompts(ids[:2], 12),
    "prefixed": rep.attack_prompts(ids[:2], 12, prefix=prefix),
    "pattern": rep.attack_prompts(ids, 12, prefix=prefix, pattern=2),
    "chat": rep.attack_prompts(ids[:2], 12, prefix=prefix, chat=([85, 58], [66])),
  }
  assert runs["repeated"]["forced_identical"] == 1.0  # the identity case
  assert runs["repeated"]["same_set_fraction"] == 1.0
  for kind, (tokens, span) in prompts.items():
    routing = rep.routing_of(graphdef, params, rest, jnp.asarray(tokens))
    assert runs[kind]["forced_identical"] == (kind == "repeated")
    assert runs[kind]["ttft_over_balanced"] == pytest.approx(
      rep.simulated_ttft(routing, moe.num_experts, 8)["over_balanced"]
    )
    capacity = expert_capacity(tokens.size, moe.num_experts, moe.top_k, 1.25, moe.capacity.min)
    loads = [rep.expert_load(i, v, moe.num_experts) for i, v in routing]
    assert runs[kind]["drop_rate"] == pytest.approx(
      np.mean([rep.drop_rate(load, capacity) for load in loads])
    )
    assert runs[kind]["same_set_fraction"] == pytest.approx(
      np.mean([rep.same_set_fraction(np.asarray(i).reshape(2, 12, -1), span) for i, _ in routing])
    )
  assert 0 <= runs["natural"]["drop_rate"] < 1 and runs["natural"]["prefill_seconds"] > 0


@pytest.mark.parametrize(
  "settings,message",
  [
    (dict(expert_shards=3), r"study\.settings\.expert_shards=3 must divide the 8 experts"),
    (dict(num_prompts=50), r"study\.settings\.num_prompts=50 must be at most the"),
    (dict(pattern=20), r"pattern=20"),
    (dict(workdir="/nonexistent"), r"study\.settings\.workdir='/nonexistent' is not a training"),
  ],
)
def test_refused_before_any_run(area, settings, message):
  with pytest.raises(ConfigError, match=message):
    runner.prepare(study(area, **settings))
