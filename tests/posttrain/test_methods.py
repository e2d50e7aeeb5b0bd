"""The post-training registries (moejax/posttrain/methods.py, parts.py): every method
of the tuples they replace, names checked without jax, settings bound once, and the
compression pipeline's decompositions the same arithmetic as before."""

import subprocess
import sys

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.posttrain import methods


def test_every_method_is_registered_in_order():
  assert list(methods.EXPERT_METHODS) == [
    "schur_astar",
    "greedy",
    "step",
    "step_no_merge",
    "frequency",
    "router_mass",
    "output_norm",
    "random",
  ]
  assert list(methods.ATOM_METHODS) == [
    "heapr",
    "heapr_first_order",
    "atom_magnitude",
    "atom_random",
  ]
  assert list(methods.METHODS) == list(methods.EXPERT_METHODS) + list(methods.ATOM_METHODS)
  assert list(methods.INTEGER_QUANTIZERS) == ["rtn", "gptq"] and "kmeans" in methods.QUANTIZERS
  assert list(methods.DECOMPOSITIONS) == ["td_moe", "tucker", "svd", "whitened_svd"]
  assert tuple(methods.COMPRESSION) == (
    ("uniform", "per_layer", "gemq", "kmeans", "codequant", "td_moe", "tucker", "svd")
    + ("whitened_svd",)
  )
  assert [methods.pruner(n).merge for n in ("step", "step_no_merge", "greedy")] == [
    "average",
    "none",
    "none",
  ]


def test_checking_a_name_imports_neither_jax_nor_numpy():
  code = (
    "import sys; from moejax.posttrain import methods; methods.pruner('heapr'); "
    "methods.family('td_moe'); methods.integer_quantizer('gptq'); "
    "print('jax' in sys.modules, 'numpy' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
  "check, message",
  [
    (lambda: methods.pruner("obs"), "--method='obs' is not known; valid: atom_magnitude"),
    (
      lambda: methods.integer_quantizer("kmeans"),
      "--quantizer='kmeans' is not known; valid: gptq, rtn$",
    ),
    (lambda: methods.family("awq", "study.arms[0].method"), "study.arms\\[0\\].method='awq'"),
    (
      lambda: methods.PRUNERS.get("random").bind(seed=1.5),
      "--seed=1.5 \\(--method=random\\) must be an integer",
    ),
    (lambda: methods.PRUNERS.get("greedy").bind(objective="l1"), "--objective='l1' is not known"),
    (lambda: methods.QUANTIZERS.get("rtn").bind(symmetric=1), "--symmetric=1 .* true or false"),
    (lambda: methods.DECOMPOSITIONS.get("svd").bind(damping=0.1), "--damping=0.1 is not a setting"),
  ],
)
def test_bad_names_and_settings_are_one_line_naming_the_flag(check, message):
  with pytest.raises(ConfigError, match=message) as error:
    check()
  assert "\n" not in str(error.value)


def test_bind_from_takes_the_declared_settings_of_a_commands_flags():
  flags = {"objective": "no_rescale", "seed": 3, "normalisation": "mean"}
  assert methods.pruner("greedy").bind_from(flags).settings == {"objective": "no_rescale"}
  assert methods.pruner("atom_random").bind_from(flags).settings == {"seed": 3}
  assert methods.pruner("frequency").bind_from(flags).settings == {}
  damp = methods.QUANTIZERS.get("gptq").bind(damp=1).settings["damp"]
  assert damp == 1.0 and isinstance(damp, float)


def test_a_decomposition_is_the_factorisation_the_pipeline_ran_before():
  """td_moe and tucker through the registry equal factorise_experts at the ranks
  allocate_ranks picks on the same whitened tensors (the pipeline's former path)."""
  from moejax.posttrain import factorise, tucker

  rng = np.random.default_rng(0)
  e, d, f, n = 4, 8, 6, 96
  experts = {
    "w_gate": rng.standard_normal((e, d, f)),
    "w_up": rng.standard_normal((e, d, f)),
    "w_down": rng.standard_normal((e, f, d)),
  }
  x, h = rng.standard_normal((n, d)), rng.standard_normal((n, f))
  outputs = {p: rng.standard_normal((n, experts[p].shape[2])) for p in experts}
  for name, whiten in (("td_moe", True), ("tucker", False)):
    tensors = (
      factorise.whitened_tensors(experts, x, h, 1e-6, outputs)
      if whiten
      else {p: np.asarray(w, np.float64) for p, w in experts.items()}
    )
    budgets = {p: tucker.dense_parameters(w.shape) // 3 for p, w in experts.items()}
    ranks = {p: tucker.allocate_ranks(tensors[p], budgets[p]) for p in experts}
    before, _ = factorise.factorise_experts(
      experts,
      x if whiten else None,
      ranks,
      hidden_inputs=h if whiten else None,
      output_samples=outputs if whiten else None,
    )
    decompose = methods.decomposition(name).bind()
    for p, w in experts.items():
      given = {"inputs": h if p == "w_down" else x, "outputs": outputs[p]} if whiten else {}
      model = decompose(w, budgets[p], **given)
      for key, value in before[p].items():
        np.testing.assert_array_equal(np.asarray(getattr(model, key), np.float32), value)


def test_per_expert_svd_never_costs_more_than_dense():
  from moejax.posttrain import tucker

  shape = (4, 8, 8)  # full rank 8 would cost 4 * 8 * 16 = 512 > 256 dense
  assert tucker.svd_rank_for_budget(shape, 10**6) == 4
  assert tucker.svd_parameters(shape, 4) == tucker.dense_parameters(shape)
