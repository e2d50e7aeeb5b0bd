r"""The config a training workdir's latest checkpoint was saved with: how to
continue a workdir that a post-training tool wrote (experiments.prune,
experiments.compress), whose model no config file describes.

  python -m experiments.train --config=configs/workdir.py:path=runs/compressed/s_gemq \
      --workdir=runs/compressed/s_gemq --config.train.steps=1300

Args: path (the workdir). Overrides (--config.train.steps=...) apply on top.
"""

from moejax.config import parse_config_arg
from moejax.errors import ConfigError


def get_config(arg=None):
  a = parse_config_arg(arg, {"path": ""})
  if not a.path:
    raise ConfigError("configs/workdir.py needs the workdir: configs/workdir.py:path=DIR")
  from moejax.train.checkpoint import latest_config

  return latest_config(a.path)[0]
