"""Every part that declares settings (routers, expert types) has them in its own
section model.moe.<name> at the declared defaults, valid as they are, closed
to unknown keys; and a stored config from before the section (flat legacy keys)
loads into it (config.with_defaults)."""
import pytest

from moejax.config import base_config, parts_with_settings, validate_config, with_defaults
from moejax.errors import ConfigError
from moejax.routing import ROUTERS

PARTS = {name: (spec, what) for name, spec, what in parts_with_settings()}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_section_holds_the_declared_defaults_and_refuses_unknown_keys(name):
  spec, what = PARTS[name]
  c = base_config()
  assert c.model.moe[name].to_dict() == dict(spec.settings), what
  validate_config(c)
  c.model.moe[name]["no_such_setting"] = 1
  with pytest.raises(ConfigError, match=rf"model\.moe\.{name} has unknown keys"):
    validate_config(c)


@pytest.mark.parametrize("router", [name for name, spec in ROUTERS.items() if spec.legacy_keys])
def test_flat_keys_of_stored_configs_move_into_the_section(router):
  spec = ROUTERS.get(router)
  saved = base_config().to_dict()
  moe = saved["model"]["moe"]
  section = moe.pop(router)
  for old, new in spec.legacy_keys:
    moe[old] = section[new]
  assert with_defaults(saved) == base_config().to_dict()
