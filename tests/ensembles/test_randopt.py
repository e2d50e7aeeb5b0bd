"""RandOpt (moejax/ensembles/): sigma = 0 is the base, bit for bit and through the
chunked predictions; the perturbation's scale; top-K against a sort; the vote
against hand counts; the study's outcome by hand; refusals naming the value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.data import get_tokenizer
from moejax.ensembles import probes, randopt, thickets
from moejax.errors import ConfigError
from moejax.evaluation.model import DecoderLM
from moejax.evaluation.probes import Example, probe_correct

from tests.helpers import host


def test_sigma_zero_returns_the_base_bit_exactly(tiny_model):
  params = host(tiny_model[2].params)
  params = jax.tree.map(lambda a: a.copy(), params)
  jax.tree.leaves(params)[0].reshape(-1)[0] = -0.0  # a signed zero survives too
  out = randopt.perturb(params, jax.random.PRNGKey(0), 3, 0.0)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(out)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_the_noise_is_sigma_times_each_tensors_rms_and_fixed_per_member(tiny_model):
  params = host(tiny_model[2].params)
  key = jax.random.PRNGKey(1)
  out = randopt.perturb(params, key, 5, 0.1)
  w = params["blocks"][0]["ffn"]["experts"]["w_up"]
  noise = np.asarray(out["blocks"][0]["ffn"]["experts"]["w_up"], np.float64) - w
  rms = np.sqrt(np.mean(np.square(w.astype(np.float64))))
  assert abs(noise.std() / (0.1 * rms) - 1) < 0.05 and abs(noise.mean()) < 0.01 * rms
  stacked = jax.vmap(lambda i: randopt.perturb(params, key, i, 0.1))(jnp.array([7, 5]))
  np.testing.assert_array_equal(
    stacked["blocks"][0]["ffn"]["experts"]["w_up"][1], out["blocks"][0]["ffn"]["experts"]["w_up"]
  )


def examples():
  text = "ROMEO: what light through yonder window breaks? It is the east."
  choice = [
    Example(text[i : i + 12], (text[i + 12 : i + 20], text[:8], text[30:38], text[5:13]), 0)
    for i in (0, 9, 20)
  ]
  greedy = [
    Example("12 + 30 =", (" 42\n",)),
    Example("7 + 5 =", (" 12\n",)),
    Example("JULIET:", (" O",)),
  ]
  return choice, greedy


@pytest.mark.integration
def test_chunked_predictions_at_sigma_zero_are_the_base_models_probe_answers(tiny_model):
  config, graphdef, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  tokenizer = get_tokenizer("byte")
  eos = tokenizer.eos_id
  choice, greedy = examples()
  tasks = [
    probes.choice_task(choice, tokenizer, eos, 64),
    probes.greedy_task(greedy, tokenizer, eos),
  ]
  out = probes.predict(
    graphdef, params, rest, tasks, key=jax.random.PRNGKey(0), indices=[0, 1, 2], sigma=0.0
  )
  lm = DecoderLM(config.model, params, rest)
  want = [
    probe_correct(lm, tokenizer, eos, choice, "choice", context=64),
    probe_correct(lm, tokenizer, eos, greedy, "greedy", context=64),
  ]
  for task, predictions, expected in zip(tasks, out, want):
    assert (predictions == predictions[:1]).all()  # every member is the base
    np.testing.assert_array_equal(probes.correct(task, predictions[0]), expected)
  # a greedy prediction is the decoded tokens: the base's own argmax continuation
  n = int(tasks[1].length[2])
  prompt = tasks[1].inputs[2:3, :n]
  scores = lm(prompt, prompt, np.ones((1, n), bool))
  assert out[1][0][2][0] == scores.argmax[0, n - 1]


def test_top_k_is_the_stable_descending_sort():
  rng = np.random.default_rng(0)
  for _ in range(20):
    scores = rng.integers(0, 4, size=12) / 4  # many ties
    by_hand = sorted(range(12), key=lambda i: (-scores[i], i))[:5]
    np.testing.assert_array_equal(randopt.top_k(scores, 5), by_hand)
    np.testing.assert_array_equal(randopt.top_k(scores, 5), np.argsort(-scores, kind="stable")[:5])
  np.testing.assert_array_equal(randopt.top_k([0.5, 0.9, 0.5, 0.9, 0.1], 3), [1, 3, 0])


def test_majority_vote_equals_a_hand_count():
  """Five members in rank order, four examples:
  e0: 2,2,1,2,3 -> 2 (three votes)
  e1: 0,1,1,0,3 -> 0 and 1 tie at two; member 0 (best ranked) said 0 -> 0
  e2: 3,1,2,0,1 -> 1 (two votes against singles)
  e3: 1,2,0,3,0 -> 0 (two votes) though the best-ranked member said 1"""
  votes = np.array([[2, 0, 3, 1], [2, 1, 1, 2], [1, 1, 2, 0], [2, 0, 0, 3], [3, 3, 1, 0]])
  np.testing.assert_array_equal(randopt.majority_vote(votes), [2, 0, 1, 0])
  sequences = np.array(
    [[[4, 2, -1], [1, 1, 1]], [[4, 3, -1], [1, 1, 1]], [[4, 3, -1], [2, 2, 2]]]
  )  # [K=3, M=2, T=3]: rows vote whole
  np.testing.assert_array_equal(randopt.majority_vote(sequences), [[4, 3, -1], [1, 1, 1]])


def test_the_outcome_by_hand():
  """Two choice examples per set (labels 0, 1), four members. Selection accuracies
  0.5, 1, 0, 1 against the base's 0.5: improving 2/4; top-2 = members 1, 3; held-out
  accuracies 0, 0.5, 1, 0.5 against the base's 0.5 (improving 1/4); best single =
  member 1 (0.5 held out); the vote of members 1 and 3 on held out: e0 tie -> member
  1's 1 (wrong), e1 both 1 (right) -> 0.5."""

  def task():
    return probes.Task("choice", None, None, None, None, None, np.array([0, 1]))

  tasks = {"t": (task(), task())}
  scored = thickets.Scored(
    {("t", "selection"): np.array([0, 0]), ("t", "held_out"): np.array([0, 0])},
    {
      ("t", "selection"): np.array([[0, 0], [0, 1], [1, 0], [0, 1]]),
      ("t", "held_out"): np.array([[1, 0], [1, 1], [0, 1], [2, 1]]),
    },
  )
  out = thickets.outcome(tasks, scored, "t", 2)
  assert out["perturbations"] == {
    "accuracy": 0.5,
    "selection_accuracy": 0.625,
    "improving": 0.5,
    "improving_held_out": 0.25,
  }
  assert out["best_single"] == {"accuracy": 0.5, "selection_accuracy": 1.0}
  assert out["topk_vote"] == {"accuracy": 0.5, "selection_accuracy": 1.0}
  assert out["base"] == {"accuracy": 0.5, "selection_accuracy": 0.5}


@pytest.mark.parametrize(
  "n, k, sigma, message",
  [
    (8, 9, 0.1, r"^k=9 is larger than n=8"),
    (8, 2, -0.5, r"^sigma=-0.5 must be a finite number >= 0"),
    (8, 0, 0.1, r"^k=0 must be an integer >= 1"),
    (8, 2, float("nan"), r"^sigma=nan"),
  ],
)
def test_refusals_name_the_value(n, k, sigma, message):
  with pytest.raises(ConfigError, match=message):
    randopt.check(n, k, sigma)


def test_top_k_refuses_k_above_n():
  with pytest.raises(ConfigError, match="k=4 is larger than n=3"):
    randopt.top_k([0.1, 0.2, 0.3], 4)


@pytest.mark.integration
def test_randopt_runs_on_an_imported_hf_checkpoint(tiny_model, tmp_path):
  """The members of an HF import (moejax/posttrain/source.py) at sigma=0 answer as the
  imported model does; at sigma > 0 they are drawn around it."""
  from moejax.interop.convert import export_hf
  from moejax.models.decoder import abstract_model
  from moejax.posttrain import source

  config, _, state = tiny_model
  params, rest = host(state.params), host(state.rest)
  export_hf(config.model, params, rest, str(tmp_path / "hf"), family="mixtral")
  imported = source.load(hf_dir=str(tmp_path / "hf"))
  graphdef = abstract_model(imported.model)[0]
  tokenizer = get_tokenizer("byte")
  _, greedy = examples()
  task = probes.greedy_task(greedy, tokenizer, tokenizer.eos_id)

  def run(sigma):
    return probes.predict(
      graphdef,
      imported.params,
      imported.rest,
      [task],
      key=jax.random.PRNGKey(0),
      indices=[0, 1],
      sigma=sigma,
    )[0]

  lm = DecoderLM(imported.model, imported.params, imported.rest)
  want = probe_correct(lm, tokenizer, tokenizer.eos_id, greedy, "greedy", context=64)
  np.testing.assert_array_equal(probes.correct(task, run(0.0)[1]), want)
  assert run(0.5).shape == (2, 3, task.answer.shape[1])
