"""One error type for bad user input, raised before anything is compiled."""


class ConfigError(ValueError):
  """A config key holds a value moejax cannot use. The message names both."""


def choice_error(key: str, value, valid) -> ConfigError:
  """`key=value` is not one of `valid`; the message lists the valid names."""
  return ConfigError(f"{key}={value!r} is not known; valid: {', '.join(sorted(valid))}")
