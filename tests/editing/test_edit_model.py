"""MoEEdit on the one Decoder (moejax/editing/edit.py), the tiny MoE LM (2 MoE
blocks, 8 experts of 32 hidden units, top-2): the edited experts' outputs on the
preserved keys and the later block's router logits on the preserved prompts
are unchanged, and they do change without the projection; an edit of one fact
makes greedy decoding of its prompt give the new value."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moejax.data.tokenizers import ByteTokenizer
from moejax.editing import capture, edit, facts, measure, methods

from tests.helpers import host

FACT = facts.Fact("Kalo Mirten", "pet", "toad", "heron")  # any subject: rows are built from it


PRESERVED = np.random.default_rng(0).integers(1, 256, size=(3, 12)).astype(np.int32)


def edited(tiny_model, **settings):
  config, _, state = tiny_model
  bound = methods.get("moe_edit").bind(
    {"layers": (0,), "tol": 1e-12, "lam": 1e-4, "target_steps": 30, **settings}
  )
  return edit.edit_model(
    config.model, host(state.params), state.rest, ByteTokenizer(), 0, [FACT], bound, PRESERVED
  )


@functools.partial(jax.jit, static_argnums=0)
def router_logits(graphdef, params, rest, tokens):
  _, _, outputs = capture.captured(nnx.merge(graphdef, params, rest), tokens)
  return outputs[("blocks", 1, "ffn", "router_logits")]


@pytest.mark.integration
@pytest.mark.parametrize("project", [True, False])
def test_preserved_outputs_and_later_routing_are_unchanged_only_with_the_projection(
  project, tiny_model
):
  _, graphdef, state = tiny_model
  params, rest, preserved = host(state.params), state.rest, PRESERVED
  new, report = edited(tiny_model, project=project)
  keys, owner = edit.preserved_keys(graphdef, params, rest, preserved, 0)
  w0 = params["blocks"][0]["ffn"]["experts"]["w_down"]
  w1 = new["blocks"][0]["ffn"]["experts"]["w_down"]
  moved = np.abs(
    np.einsum("rf,rfd->rd", keys, w1[owner].astype(np.float64))
    - np.einsum("rf,rfd->rd", keys, w0[owner].astype(np.float64))
  ).max()
  before = router_logits(graphdef, params, rest, jnp.asarray(preserved))
  after = router_logits(graphdef, new, rest, jnp.asarray(preserved))
  shift = float(jnp.max(jnp.abs(after - before)))
  assert np.abs(w1 - w0).max() > 1e-2  # an edit happened
  if project:
    assert report["layers"][0]["free_dims_min"] > 0
    assert moved < 1e-5, moved
    assert shift < 1e-5, shift
  else:
    assert moved > 1e-3 and shift > 1e-4, (moved, shift)


@pytest.mark.integration
def test_an_edit_changes_the_facts_greedy_completion(tiny_model):
  _, graphdef, state = tiny_model
  params, rest = host(state.params), state.rest
  tokenizer, rows = ByteTokenizer(), facts.edit_rows([FACT])
  _, hit_before, _ = measure.scores(graphdef, params, rest, tokenizer, 0, rows)
  new, _ = edited(
    tiny_model, layers=(1,), clamp=50.0, target_steps=100, target_decay=0.0, target_lr=1.0
  )
  _, hit_after, _ = measure.scores(graphdef, new, rest, tokenizer, 0, rows)
  assert not hit_before.any() and hit_after.all()


def test_settings_are_checked_once_when_bound(tiny_model):
  with pytest.raises(Exception, match=r"moe_edit.lam=-0.5 must be >= 0"):
    methods.get("moe_edit").bind({"lam": -0.5})
  with pytest.raises(Exception, match="has no setting rank=2"):
    methods.get("lstsq").bind({"rank": 2})
  with pytest.raises(Exception, match="block 5 is not an MoE block"):
    methods.check_model(methods.get("finetune").bind({"layers": (5,)}), tiny_model[0].model)


@pytest.mark.parametrize("num_layers, expected", [(2, (1,)), (6, (1, 2)), (12, (1, 2, 3, 4, 5))])
def test_default_layers_are_the_early_middle_moe_blocks(num_layers, expected, tiny_model):
  m = tiny_model[0].model.copy_and_resolve_references()
  m.num_layers = num_layers
  assert methods.default_layers(m) == expected
  bound = methods.with_model_layers(methods.get("moe_edit").bind(), m, given=False)
  assert bound.options["layers"] == ((1, 2) if num_layers >= 3 else expected)
  given = methods.get("moe_edit").bind({"layers": (5,)})
  assert methods.with_model_layers(given, m, given=True) is given
