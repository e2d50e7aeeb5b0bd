"""Probe scoring on a hand-written lookup-table model whose answers we set."""

import re

import numpy as np
import pytest

from moejax.data import mix_synthetic
from moejax.data.tokenizers import ByteTokenizer
from moejax.errors import ConfigError
from moejax.evaluation import probe_data
from moejax.evaluation.model import LogitsLM
from moejax.evaluation.probes import (
  Example,
  choose,
  continuation_row,
  probe_correct,
  accuracy_by_group,
)

V, TOK = 256, ByteTokenizer()


def lookup_model(known: dict[str, str]):
  """Byte logits +5 on answer[j] when the text since the last separator (byte 0) is
  prompt + answer[:j] for a known (prompt, answer); uniform everywhere else."""

  def fn(inputs):
    logits = np.zeros(inputs.shape + (V,))
    for b, row in enumerate(inputs):
      for pos in range(row.shape[0]):
        seen = row[: pos + 1].tolist()
        start = len(seen) - seen[::-1].index(0) if 0 in seen else 0
        text = bytes(seen[start:]).decode("utf-8", "replace")
        for prompt, answer in known.items():
          j = len(text) - len(prompt)
          if 0 <= j < len(answer) and text == prompt + answer[:j]:
            logits[b, pos, ord(answer[j])] = 5.0
    return logits

  return LogitsLM(fn, V)


def run(examples, known, scoring, **kw):
  return probe_correct(lookup_model(known), TOK, 0, examples, scoring, context=64, **kw)


def test_greedy_exact_match_counts_only_complete_answers():
  examples = [
    Example("The capital of Zor is", (" Olvane.",), 0, "train"),
    Example("Zor's capital is", (" Olvane.",), 0, "heldout"),
    Example("12+34=", ("46\n",), 0, "train"),
    Example("The colour of Zor is", (" teal.",), 0, "heldout"),
  ]
  known = {
    "The capital of Zor is": " Olvane.",
    "Zor's capital is": " Olvane!",  # one byte off
    "12+34=": "46\n",
  }  # the colour is unknown
  correct = run(examples, known, "greedy")
  assert correct.tolist() == [True, False, True, False]
  assert accuracy_by_group(correct, [e.group for e in examples]) == {
    "heldout": {"accuracy": 0.0, "n": 2},
    "train": {"accuracy": 1.0, "n": 2},
    "all": {"accuracy": 0.5, "n": 4},
  }


def test_choice_picks_the_likeliest_candidate_ties_to_the_first():
  choices = ("apple pie", "banana", "cherry tart", "date")
  examples = [Example(f"p{i}:", choices, label, "d") for i, label in enumerate([0, 1, 2, 3])]
  known = {"p0:": "apple pie", "p1:": "banana", "p2:": "date"}  # p2 believes a wrong one
  # p3: uniform model, every candidate -ln 256 per byte: the first wins, label is 3
  assert run(examples, known, "choice").tolist() == [True, True, False, False]


def test_choose_by_hand():
  logprob, num_bytes = np.array([[-10.0, -6.0], [-3.0, -4.0]]), np.array([[10, 2], [1, 8]])
  assert choose(logprob, num_bytes, "bytes").tolist() == [0, 1]  # -1 vs -3; -3 vs -0.5
  assert choose(logprob, num_bytes, "none").tolist() == [1, 0]
  with pytest.raises(ConfigError, match="normalize='chars'"):
    choose(logprob, num_bytes, "chars")


def test_long_prompts_lose_their_oldest_tokens():
  row = continuation_row(np.arange(1, 11), np.array([20, 21]), context=5)
  assert row.inputs.tolist() == [7, 8, 9, 10, 20] and row.targets.tolist() == [8, 9, 10, 20, 21]
  assert row.score.tolist() == [False, False, False, True, True]
  with pytest.raises(ConfigError, match="does not fit"):
    continuation_row(np.arange(3), np.arange(6), context=5)


def test_probe_data_is_seeded_and_right():
  text = "The quick brown fox jumps over the lazy dog. " * 30
  docs = [("a", text), ("a", text[7:]), ("a", text[3:]), ("b", text)]
  for name in probe_data.PROBES:
    assert probe_data.probe_examples(name, docs, 4, 3) == probe_data.probe_examples(
      name, docs, 4, 3
    )
  assert probe_data.probe_examples("facts", docs, 5, 3) != probe_data.probe_examples(
    "facts", docs, 4, 3
  )
  for e in probe_data.last_word_examples(docs, 0, 3, size=40):
    assert e.prompt + e.choices[0] in text and re.fullmatch(r" [A-Za-z]{3,}", e.choices[0])
  passages = probe_data.next_passage_examples(docs, 0, 3, size=40)
  assert {e.group for e in passages} == {"a"}  # b has one document: no distractors
  for e in passages:
    assert len(e.choices) == 4 and e.prompt + e.choices[e.label] in text


def test_fact_probes_ask_the_mix_corpus_facts_in_trained_and_held_out_wording():
  documents = mix_synthetic.fact_documents(mix_synthetic.SEED, mix_synthetic.NUM_PEOPLE)
  text = {
    held: " " + " ".join(d.text for d in documents if d.held_out == held) + " "
    for held in (False, True)
  }
  facts = probe_data.fact_examples(0, 4)
  groups = [e.group for e in facts]
  assert groups.count("train_template") == 4 * 5 * 2 and groups.count("heldout_template") == 4 * 5
  for e in facts:  # a whole sentence of the corpus, trained on or held out as its group says
    sentence = f" {e.prompt}{e.choices[0]} "
    assert (sentence in text[False]) == (e.group == "train_template"), sentence
    assert (sentence in text[True]) == (e.group == "heldout_template"), sentence
  assert mix_synthetic.fact_prompt("By trade, {name} is a {value}.", "Ka Lo", "ferry pilot") == (
    "By trade, Ka Lo is a",
    " ferry pilot.",
  )
  assert mix_synthetic.fact_prompt(
    "Of all colours, {name} likes {value} best.", "Ka Lo", "teal"
  ) == ("Of all colours, Ka Lo likes", " teal best.")


def test_arithmetic_probes_are_the_mix_corpus_held_out_problems():
  documents = mix_synthetic.arithmetic_documents(mix_synthetic.SEED, mix_synthetic.NUM_PROBLEMS)
  lines = {
    held: {line for d in documents if d.held_out == held for line in d.text.split("\n")}
    for held in (False, True)
  }
  examples = probe_data.arithmetic_examples(0, 5)
  assert [e.group for e in examples] == ["2-digit"] * 5 + ["3-digit"] * 5
  for e in examples:
    a, op, b = re.fullmatch(r"(\d+) ([-+*]) (\d+) =", e.prompt).groups()
    c = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    assert e.choices == (f" {c}\n",) and len(a) == len(b) == int(e.group[0])
    assert f"{a} {op} {b} = {c}" in lines[True] and f"{a} {op} {b} = {c}" not in lines[False]


def test_mix_probes_run_by_default_only_for_a_model_trained_on_mix():
  assert probe_data.default_probes("mix") == tuple(probe_data.PROBES)
  for dataset in ("shakespeare", None):
    assert probe_data.default_probes(dataset) == ("next_passage", "last_word")


def test_bad_input():
  with pytest.raises(ConfigError, match="exactly one"):
    run([Example("a", ("b", "c"))], {}, "greedy")
  with pytest.raises(ConfigError, match="scoring='beam'"):
    run([Example("a", ("b",))], {}, "beam")
  with pytest.raises(ConfigError, match="probe 'trivia' is not known"):
    probe_data.probe_examples("trivia", [], 0, 1)


def test_every_probe_fits_a_short_context():
  text = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar. " * 8
  docs = [("a", text), ("a", text[5:]), ("a", text[9:])]
  for name, scoring in probe_data.PROBES.items():  # the longest fact answer: 19 bytes
    examples = probe_data.probe_examples(name, docs, 0, 2, context=24)
    assert examples and all(len(c) <= 24 for e in examples for c in e.choices), name
    assert len(probe_correct(lookup_model({}), TOK, 0, examples, scoring, context=24)) == len(
      examples
    )
