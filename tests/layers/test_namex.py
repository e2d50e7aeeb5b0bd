"""NAMEx in the decoder (model.moe.merge='namex', moejax/experts/merged.py): the base
expert carried from MoE layer to MoE layer, against EP-CAMEx models whose per-layer
bases are computed by hand (orthogonal task vectors: alpha = 1 / ||tau||; a real
momentum: the heavy-ball recursion; a complex one: numpy complex arithmetic; gamma =
0: every layer merges with the first layer's base), zero task vectors, upcycling,
and the refusals."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from moejax.configs.lm_shakespeare_moe import get_config
from moejax.errors import ConfigError
from moejax.experts import merged
from moejax.merging.nash import nash_weights
from moejax.models import Decoder
from moejax.train.step import split_model
from moejax.train.upcycle import upcycle_params
from moejax.validation import validate_config, validate_model

NAMES = ("w_gate", "w_up", "w_down")
E = 3
TOKENS = jax.random.randint(jax.random.key(4), (2, 12), 0, 256)


def model_config(merge="namex", num_layers=2, **merged_settings):
  m = get_config("size=tiny").model
  m.num_layers = num_layers
  m.moe.merge, m.moe.loss_weights, m.moe.num_experts = merge, {}, E
  m.moe.merged.update({"segment_len": 4, "eta": 0.6, **merged_settings})
  validate_model(m)
  return ml_collections.FrozenConfigDict(m)


def split(m, seed=0):
  graphdef, params, rest = split_model(Decoder(m, rngs=nnx.Rngs(seed)))
  return graphdef, jax.tree.map(np.asarray, params), rest


def logits_of(graphdef, params, rest):
  return np.asarray(jax.jit(lambda p: nnx.merge(graphdef, p, rest)(TOKENS)[0])(params))


def flat(weights) -> np.ndarray:
  """[E, n]: every expert's weights in one row (the task-vector layout)."""
  return np.concatenate([np.reshape(weights[k], (len(weights[k]), -1)) for k in NAMES], 1)


def unflat(vector, like) -> dict:
  out, start = {}, 0
  for k in NAMES:
    size = like[k].size
    out[k] = vector[start : start + size].reshape(like[k].shape)
    start += size
  return out


def hand_bases(params, num_layers, gamma, beta=0.0, alpha_of=None):
  """Each layer's base (flat, float64): E_b^{l+1} = E_b^l + Re(gamma mu^{l+1}),
  mu^{l+1} = beta mu^l + sum_i alpha_i tau_i, in numpy complex arithmetic."""
  first = params["blocks"][0]["ffn"]["merge_base"]
  base = flat({k: np.asarray(first[k], np.float64) for k in NAMES})[0]
  momentum = np.zeros(base.shape, np.complex128)
  bases = []
  for layer in range(num_layers):
    bases.append(base)
    taus = flat(params["blocks"][layer]["ffn"]["experts"]).astype(np.float64) - base
    alpha = nash_weights(taus @ taus.T) if alpha_of is None else alpha_of(taus)
    momentum = beta * momentum + alpha @ taus
    base = base + np.real(gamma * momentum)
  return bases


def ep_camex_twin(params, bases, like):
  """An EP-CAMEx model's params: `params` with layer l's base set to bases[l]."""
  out = jax.tree.map(np.copy, params)
  for layer, base in enumerate(bases):
    out["blocks"][layer]["ffn"]["merge_base"] = {
      k: v[None].astype(np.float32) for k, v in unflat(base, like).items()
    }
  return out


def assert_namex_is_ep_camex_with(bases_of, num_layers=2, **settings):
  m = model_config("namex", num_layers, **settings)
  graphdef, params, rest = split(m)
  twin = model_config("ep_camex", num_layers, **{"eta": settings.get("eta", 0.6)})
  twin_graphdef, twin_params, twin_rest = split(twin)
  like = {k: v[0] for k, v in params["blocks"][0]["ffn"]["merge_base"].items()}
  bases = bases_of(params)
  np.testing.assert_allclose(
    logits_of(graphdef, params, rest),
    logits_of(twin_graphdef, ep_camex_twin(params, bases, like), twin_rest),
    rtol=2e-4,
    atol=2e-4,
  )
  return bases


def test_only_the_first_namex_layer_owns_a_base_expert():
  _, params, _ = split(model_config("namex", 3))
  owns = ["merge_base" in params["blocks"][i]["ffn"] for i in range(3)]
  assert owns == [True, False, False]


def test_orthogonal_task_vectors_move_the_next_base_by_their_unit_directions():
  """tau_i on disjoint entries: alpha_i = 1 / ||tau_i||, so E_b^1 = E_b^0 + gamma sum_i
  tau_i / ||tau_i|| (the spec's closed form, not nash_weights)."""
  m = model_config("namex", 2, gamma=0.7)
  graphdef, params, rest = split(m)
  ffn = params["blocks"][0]["ffn"]
  rng = np.random.default_rng(0)
  experts = {k: np.repeat(ffn["merge_base"][k], E, 0) for k in NAMES}
  for i in range(E):  # expert i differs from the base in column i of w_gate only
    experts["w_gate"][i, :, i] += (i + 1) * rng.standard_normal(experts["w_gate"].shape[1])
  ffn["experts"] = experts
  taus = flat(experts).astype(np.float64) - flat(ffn["merge_base"])[0]
  assert np.allclose(taus @ taus.T, np.diag(np.diag(taus @ taus.T)))
  unit = hand_bases(params, 2, 0.7, alpha_of=lambda t: 1.0 / np.linalg.norm(t, axis=1))
  np.testing.assert_allclose(unit[1], hand_bases(params, 2, 0.7)[1], rtol=1e-9)
  twin = model_config("ep_camex", 2)
  twin_graphdef, twin_params, twin_rest = split(twin)
  like = {k: v[0] for k, v in ffn["merge_base"].items()}
  np.testing.assert_allclose(
    logits_of(graphdef, params, rest),
    logits_of(twin_graphdef, ep_camex_twin(params, unit, like), twin_rest),
    rtol=2e-4,
    atol=2e-4,
  )


def test_a_real_momentum_is_the_heavy_ball_recursion_over_layers():
  beta, gamma = 0.6, 0.5

  def heavy_ball(params):
    first = params["blocks"][0]["ffn"]["merge_base"]
    base = flat({k: np.asarray(first[k], np.float64) for k in NAMES})[0]
    velocity, bases = np.zeros_like(base), []
    for layer in range(4):
      bases.append(base)
      taus = flat(params["blocks"][layer]["ffn"]["experts"]).astype(np.float64) - base
      velocity = beta * velocity + nash_weights(taus @ taus.T) @ taus
      base = base + gamma * velocity
    return bases

  bases = assert_namex_is_ep_camex_with(heavy_ball, 4, gamma=gamma, momentum_real=beta)
  plain = hand_bases(split(model_config("namex", 4))[1], 4, gamma)
  assert np.max(np.abs(bases[3] - plain[3])) > 1e-3  # the momentum changes the last base


def test_a_complex_momentum_keeps_the_real_part_of_gamma_mu():
  beta = 0.5 + 0.4j
  assert_namex_is_ep_camex_with(
    lambda p: hand_bases(p, 4, 0.5, beta), 4, gamma=0.5, momentum_real=0.5, momentum_imag=0.4
  )


def test_with_gamma_zero_namex_is_ep_camex_with_the_first_layers_base_everywhere():
  def first_base_everywhere(params):
    base = flat(params["blocks"][0]["ffn"]["merge_base"])[0].astype(np.float64)
    return [base] * 3

  assert_namex_is_ep_camex_with(first_base_everywhere, 3, gamma=0.0, momentum_real=0.9)


def test_a_zero_task_vector_takes_no_part_and_identical_experts_give_no_step():
  rng = np.random.default_rng(1)
  base = {k: rng.standard_normal((4, 5)) for k in NAMES}
  taus = [{k: rng.standard_normal((4, 5)) for k in NAMES} for _ in range(2)]
  experts = {k: np.stack([base[k], base[k] + taus[0][k], base[k] + taus[1][k]]) for k in NAMES}
  g = flat({k: np.stack([t[k] for t in taus]) for k in NAMES})
  alpha = nash_weights(g @ g.T)
  with jax.enable_x64(True):
    step = merged.nash_step(base, experts)
    same = merged.nash_step(base, {k: np.stack([base[k]] * 3) for k in NAMES})
  np.testing.assert_allclose(flat({k: np.asarray(step[k])[None] for k in NAMES})[0], alpha @ g)
  for k in NAMES:
    assert np.all(np.asarray(same[k]) == 0.0)


def test_upcycled_merged_layers_start_as_the_dense_model():
  """Every expert and the base a copy of the layer's FFN: SMEAR and EP-CAMEx give the
  dense logits; NAMEx with eta = 1 too (the carried base cancels); NAMEx with eta < 1
  mixes the first layer's FFN into later layers, so it does not."""
  dense_m = ml_collections.ConfigDict(model_config("smear", 2).to_dict())
  dense_m.ffn_type, dense_m.d_ff = "dense", dense_m.moe.expert_d_ff
  graphdef, dense_params, rest = split(ml_collections.FrozenConfigDict(dense_m))
  want = logits_of(graphdef, dense_params, rest)
  for merge, eta, equal in [("smear", 1.0, True), ("ep_camex", 0.6, True), ("namex", 1.0, True)]:
    graphdef, params, rest = split(model_config(merge, 2, eta=eta), seed=1)
    params = upcycle_params(dense_params, params, top_k=1)
    got = logits_of(graphdef, params, rest)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=merge)
  graphdef, params, rest = split(model_config("namex", 2, eta=0.6), seed=1)
  got = logits_of(graphdef, upcycle_params(dense_params, params, top_k=1), rest)
  assert np.max(np.abs(got - want)) > 1e-3


@pytest.mark.parametrize(
  "merge,key,value,named",
  [
    ("ep_camex", "momentum_real", 0.5, "model.moe.merged.momentum_real=0.5"),
    ("smear", "momentum_imag", 0.1, "model.moe.merged.momentum_imag=0.1"),
    ("namex", "momentum_imag", float("nan"), "model.moe.merged.momentum_imag=nan"),
    ("namex", "gamma", -1.0, "model.moe.merged.gamma=-1.0"),
  ],
)
def test_bad_namex_settings_are_refused_in_one_line(merge, key, value, named):
  m = get_config("size=tiny").model
  m.moe.merge, m.moe.loss_weights = merge, {}
  m.moe.merged[key] = value
  with pytest.raises(ConfigError) as error:
    validate_model(m)
  assert named in str(error.value) and "\n" not in str(error.value)


def test_namex_is_refused_in_a_scanned_model_and_in_kv_cache_decoding():
  from moejax.inference.generate import generation_config

  c = get_config("size=tiny,merge=namex")
  validate_config(c)
  with pytest.raises(ConfigError, match=r"^model\.moe\.merge='namex': merged experts route by"):
    generation_config(c.model)
  c.model.scan_layers = True
  with pytest.raises(ConfigError, match="model.moe.merge='namex' passes the base expert"):
    validate_config(c)


def test_a_later_namex_layer_called_alone_asks_for_the_carried_base():
  model = Decoder(model_config("namex", 2), rngs=nnx.Rngs(0))
  layer = model.block_list()[1].ffn
  with pytest.raises(ValueError, match="takes its base expert from the previous"):
    layer(jnp.ones((1, 4, layer.experts.weights(jnp.float32)["w_gate"].shape[1])))


def test_rematerialised_blocks_pass_the_base_on():
  m = model_config("namex", 3, momentum_real=0.5)
  rematerialised = ml_collections.ConfigDict(m.to_dict())
  rematerialised.remat = "full"
  graphdef, params, rest = split(m)
  remat_graphdef, _, remat_rest = split(ml_collections.FrozenConfigDict(rematerialised))
  np.testing.assert_allclose(
    logits_of(remat_graphdef, params, remat_rest), logits_of(graphdef, params, rest), atol=1e-6
  )
