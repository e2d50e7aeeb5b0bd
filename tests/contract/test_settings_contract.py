"""Every part that declares settings (routers, expert types, losses) has them in its
own section (model.moe.<name>; a loss's in model.moe.losses.<name>) at the declared
defaults, valid as they are, closed to unknown keys; every flat key of older
configs (legacy_keys) loads into its section (moejax/migrate.with_defaults) and is refused
in a live config; and a router or loss added from outside moejax/config.py (here:
from this test) gets its section, overrides and validation with no edit of config.py."""

import sys

import jax.numpy as jnp
import pytest
from absl import flags
from ml_collections import config_flags

from moejax.config import base_config, parts_with_settings
from moejax.migrate import with_defaults
from moejax.validation import validate_config
from moejax.errors import ConfigError
from moejax.losses import LOSSES, loss_config, register_loss
from moejax.registry import section_of
from moejax.routing import ROUTERS, RouterConfig, RouterOutput, call_router, register_router
from moejax.routing.topk import softmax_top_k
from moejax.train.sweep import apply_overrides
from tests.helpers import moe_cfg, set_key

PARTS = {part.path: part for part in parts_with_settings()}
LEGACY = [(path, old, key) for path, part in PARTS.items() for old, key in part.legacy_keys]


def other_value(default):
  """A value of the default's type that differs from it."""
  if isinstance(default, bool):
    return not default
  if isinstance(default, str):
    return default + "_old"
  return default + 1 if isinstance(default, int) else default * 0.5 + 0.25


def test_losses_and_routers_have_sections():
  assert {
    "losses.dpsl",
    "losses.smooth_boundary",
    "probmoe",
    "sere",
    "topk_rounded",
    "smooth_topk",
    "as_coot",
    "capacity_aware",
    "mahalanobis",
    "atomic",
  } <= set(PARTS)


@pytest.mark.parametrize("path", sorted(PARTS))
def test_section_holds_the_declared_defaults_and_refuses_unknown_keys(path):
  part = PARTS[path]
  c = base_config()
  assert section_of(c.model.moe, path).to_dict() == dict(part.defaults), part.what
  validate_config(c)
  section_of(c.model.moe, path)["no_such_setting"] = 1
  with pytest.raises(ConfigError, match=rf"model\.moe\.{path} has unknown keys"):
    validate_config(c)


def test_an_unknown_loss_section_is_refused():
  c = base_config()
  c.model.moe.losses.no_such_loss = {"alpha": 1.0}
  with pytest.raises(
    ConfigError,
    match=r"model\.moe\.losses has unknown sections "
    r"\['no_such_loss'\]",
  ):
    validate_config(c)


@pytest.mark.parametrize("path,old,key", LEGACY)
def test_each_flat_key_of_a_stored_config_moves_into_its_section(path, old, key):
  saved = base_config().to_dict()
  moe = saved["model"]["moe"]
  parent, _, name = path.rpartition(".")
  holder = section_of(moe, parent) if parent else moe
  value = other_value(holder.pop(name)[key])  # a config from before the section
  moe[old] = value
  expected = base_config()
  set_key(expected.model.moe, f"{path}.{key}", value)
  assert with_defaults(saved) == expected.to_dict()


@pytest.mark.parametrize("path,old,key", LEGACY)
def test_a_flat_key_in_a_live_config_is_refused(path, old, key):
  c = base_config()
  c.model.moe[old] = section_of(c.model.moe, path)[key]
  with pytest.raises(ConfigError, match=rf"model\.moe\.{old}=.*model\.moe\.{path}\.{key}"):
    validate_config(c)
  with pytest.raises(ConfigError, match=rf"model\.moe\.{old}="):
    PARTS[path].parse(c.model.moe)  # also where a part's config is built (a hand-built cfg)


def test_a_router_is_one_file_and_one_test(monkeypatch):
  """What a new router's file does: register with its settings, defaults and
  validation. config.py is not edited, yet the section exists, overrides reach the
  router (sweep overrides and --config.* flags), bad values are refused by name."""

  def validate(cfg):
    assert isinstance(cfg, RouterConfig)  # parsed once, never model.moe itself
    width = cfg.settings["width"]
    if width < 1:
      raise ConfigError(f"model.moe.throwaway.width={width} must be >= 1")

  @register_router(
    "throwaway",
    settings={"width": 2, "scale": 1.0},
    legacy_keys={"throwaway_width": "width"},
    validate_settings=validate,
  )
  def route(logits, *, cfg, state, rng, train):
    del rng, train
    assert isinstance(cfg, RouterConfig)
    s = cfg.settings
    routing, probs = softmax_top_k(s["scale"] * logits, s["width"], cfg.renormalize)
    return RouterOutput(routing, logits, probs, {}, state)

  try:
    c = base_config()
    assert c.model.moe.throwaway.to_dict() == {"width": 2, "scale": 1.0}
    apply_overrides(c, ["model.moe.router=throwaway", "model.moe.throwaway.width=3"])
    validate_config(c)
    out = call_router("throwaway", jnp.zeros((4, 8)), c.model.moe, train=True)
    assert out.routing.num_slots == 3

    argv = ["prog", "--config.model.moe.throwaway.width=0"]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads its overrides there
    fv = flags.FlagValues()
    config_flags.DEFINE_config_dict("config", base_config(), flag_values=fv)
    fv(argv)
    with pytest.raises(ConfigError, match=r"model\.moe\.throwaway\.width=0 must be >= 1"):
      validate_config(fv.config)

    stored = base_config().to_dict()
    del stored["model"]["moe"]["throwaway"]
    stored["model"]["moe"]["throwaway_width"] = 5
    assert with_defaults(stored)["model"]["moe"]["throwaway"] == {"width": 5, "scale": 1.0}
    assert moe_cfg(throwaway={"scale": 2.0}).throwaway.width == 2
  finally:
    ROUTERS.remove("throwaway")
  assert "throwaway" not in base_config().model.moe


def test_a_loss_is_one_file_and_one_test():
  """The same for a loss, named like a router on purpose: its section is
  model.moe.losses.sere, apart from the router's model.moe.sere."""

  def validate(cfg):
    scale = cfg.settings["scale"]
    if scale <= 0:
      raise ConfigError(f"model.moe.losses.sere.scale={scale} must be > 0")

  @register_loss("sere", settings={"scale": 1.0}, validate_settings=validate)
  def scaled_z_loss(out, cfg):
    return cfg.settings["scale"] * jnp.mean(jnp.square(out.logits))

  try:
    c = base_config()
    assert c.model.moe.losses.sere.to_dict() == {"scale": 1.0}
    assert c.model.moe.sere.to_dict() == dict(ROUTERS.get("sere").settings)
    apply_overrides(c, ["model.moe.losses.sere.scale=3.0"])
    c.model.moe.loss_weights.sere = 1e-2
    validate_config(c)
    out = RouterOutput(None, jnp.ones((2, 4)), jnp.full((2, 4), 0.25), {}, {})
    assert float(LOSSES.get("sere")(out, loss_config("sere", c.model.moe))) == 3.0
    c.model.moe.losses.sere.scale = -1.0
    with pytest.raises(ConfigError, match=r"model\.moe\.losses\.sere\.scale=-1\.0 must be > 0"):
      validate_config(c)
  finally:
    LOSSES.remove("sere")
  assert "sere" not in base_config().model.moe.losses
