"""The command-line contract shared by every entry point in experiments/.

    from moejax import cli
    _N = cli.checked(flags.DEFINE_integer("n", 3, "..."), cli.at_least(1))
    def main(argv): ...
    if __name__ == "__main__":
      cli.run(main)

A refused input (a bad flag, config key, file or workdir) exits with status 2
and prints one line on stderr, `error: <what> (<flag, key or file>=<value>)`;
`--verbose` prints the traceback too. Refused means a ConfigError (raised by
moejax code that checked its input) or an absl flags.Error (raised while
parsing, which runs the validators attached here). Anything else is a bug and
keeps its traceback. Entry points check their flags and workdirs (the
files and workdirs helpers of moejax/cli_files.py) before they create, write or
compile anything.
"""

import math
import re
import sys
import traceback

from absl import app, flags, logging

from moejax.errors import ConfigError

FLAGS = flags.FLAGS
VERBOSE = flags.DEFINE_bool("verbose", False, "On a refused input, print the traceback too.")
EXIT_REFUSED = 2


def run(main) -> None:
  """app.run(main) with flag parsing and main held to the contract."""
  app.run(lambda argv: call(main, argv), flags_parser=parse_flags)


def parse_flags(argv: list[str]) -> list[str]:
  """FLAGS(argv) (validators included); a refused flag or config key exits with one line."""
  verbose = any(a in ("--verbose", "--verbose=true", "--verbose=1") for a in argv)
  try:
    args = FLAGS(argv)
  # absl's flags.Error for bad values; ml_collections raises KeyError/AttributeError for
  # an unknown dotted key, OSError for a config file it cannot load, and a ValueError
  # (ConfigError included) or TypeError for a value of the wrong type. Anything else
  # raised while parsing (a bug in a config file's get_config) keeps its traceback.
  except (flags.Error, KeyError, AttributeError, OSError, ValueError, TypeError) as e:
    refuse(_flag_message(e, argv), verbose=verbose)
  for name, flag in FLAGS._flags().items():  # a config file that failed to load
    value = flag.value
    if value is not None and type(value).__name__ == "_ErrorConfig":  # a deferred IOError
      try:
        value.lock()
      except OSError as e:
        filename = getattr(flag, "config_filename", "")  # ml_collections' config flag
        refuse(_config_file_message(e, f"--{name}={filename}"), verbose=verbose)
  return args


def call(main, argv: list[str]):
  """main(argv) after parse_flags; a ConfigError exits with one line."""
  if not FLAGS["verbosity"].present:  # orbax logs every save and restore at INFO
    logging.set_verbosity(logging.WARNING)
  try:
    return main(argv)
  except ConfigError as e:
    refuse(str(e), verbose=VERBOSE.value)


def refuse(message: str, *, verbose: bool) -> None:
  """Print `error: message` (one line; after the traceback with --verbose) and exit 2."""
  if verbose:
    traceback.print_exc()
  line = " ".join(message.split())
  sys.stderr.write(f"error: {line}\n")
  sys.stderr.flush()
  sys.exit(EXIT_REFUSED)


def _flag_message(error: Exception, argv: list[str]) -> str:
  """One line for an exception raised while parsing argv."""
  text = str(error).strip()
  if not isinstance(error, flags.Error):  # ml_collections: an unknown dotted config key
    words = re.findall(r"\w+", text)  # "'nope'", or "'nope'\nDid you mean \"rope\" ..."
    key = words[0] if words else text
    hint = re.search(r'Did you mean "(\w+)"', text.replace("\\", ""))
    for arg in argv:
      name, _, value = arg.lstrip("-").partition("=")
      if "." in name and key in name.split(".")[1:]:
        dotted = name.split(".", 1)[1]
        from moejax.config import moved_key  # the schema, only for a refused key

        if moved_key(dotted):
          use = f"a flat key of older configs: use {moved_key(dotted)}"
          return f"{dotted} is {use} (--{name}={value})"
        suggestion = f"; did you mean {hint.group(1)}?" if hint else ""
        return f"unknown config key {dotted}{suggestion} (--{name}={value})"
    if isinstance(error, OSError):
      config_arg = next((a for a in argv if re.match(r"--?config=", a)), "--config")
      return _config_file_message(error, config_arg)
    return f"cannot parse the flags: {type(error).__name__}: {text}"
  if "\n" in text:  # a config file that raised: its last line is the exception
    text = text.splitlines()[-1]
    text = re.sub(r"^[\w.]*(ConfigError|Error): ", "", text)
    config_flag = next((a for a in argv if re.match(r"--?config=", a)), None)
    return f"{text} ({config_flag})" if config_flag else text
  required = re.match(
    r"flag --([\w.]+)=None: Flag --[\w.]+ must have a value other than None", text
  )
  if required:
    return f"a required flag is missing (--{required.group(1)})"
  match = re.match(r"flag --([\w.]+)=(.*?): (.*)$", text, re.S)
  if match:
    name, value, what = match.groups()
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    return f"{what.rstrip('.')} (--{name}={given[-1] if given else value})"
  return text


def _config_file_message(error: OSError, flag: str) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  reason = next(
    (line for line in reversed(lines) if "No such file" in line or "Error" in line),
    lines[-1] if lines else "",
  )
  return f"cannot load the config file: {reason} ({flag})"


# ---- flag validators: attached to a flag, run by parse_flags -------------------------------


def checked(holder, check, expected: str | None = None):
  """Attach `check` (a predicate, e.g. at_least(1)) to a flag; returns the flag holder.

  The predicate sees each element of a list flag, which must hold at least one
  element; None (unset) always passes."""
  expected = expected or check.expected

  def ok(value):
    values = value if isinstance(value, list) else [value]
    return value is None or all(_safe(check, v) for v in values)

  flag = FLAGS[holder.name]
  if isinstance(flag, flags.MultiFlag) or isinstance(flag.parser, flags.ListParser):
    flags.register_validator(
      holder.name, lambda v: v is None or len(v) > 0, message="expected at least one value"
    )
  flags.register_validator(holder.name, ok, message=f"expected {expected}")
  return holder


def _safe(check, value) -> bool:
  try:
    return bool(check(value))
  except (TypeError, ValueError):
    return False


def _predicate(fn, expected: str):
  fn.expected = expected
  return fn


def at_least(low, kind=int):
  """A number >= low; list elements (strings) are read with `kind`."""
  return _predicate(
    lambda v: math.isfinite(kind(v)) and kind(v) >= low,
    f"{'an integer' if kind is int else 'a finite number'} >= {low}",
  )


def in_range(low, high, *, low_open=False):
  """A number in [low, high] (or (low, high] with low_open)."""
  lo = "(" if low_open else "["
  return _predicate(
    lambda v: (
      math.isfinite(float(v))
      and float(v) <= high
      and (low < float(v) if low_open else low <= float(v))
    ),
    f"a finite number {'>' if low_open else '>='} {low}"
    if math.isinf(high)
    else f"a number in {lo}{low}, {high}]",
  )


def one_of(*names):
  return _predicate(lambda v: v in names, "one of " + ", ".join(names))


def host_port():
  return _predicate(lambda v: re.fullmatch(r"[^:\s]+:\d{1,5}", v) is not None, "HOST:PORT")


def token_ids(text: str, vocab_size: int, flag: str) -> list[int]:
  """One comma-separated list of token ids (a --prompt_ids value), each in [0, vocab_size)."""
  where = f"(--{flag}={text})"
  try:
    ids = [int(t) for t in text.replace(" ", "").split(",") if t]
  except ValueError as e:
    raise ConfigError(f"expected comma-separated integers {where}") from e
  if not ids:
    raise ConfigError(f"expected at least one token id {where}")
  bad = [i for i in ids if not 0 <= i < vocab_size]
  if bad:
    raise ConfigError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size}) {where}")
  return ids


def preset_or_ints(spec: str, presets: dict, fields: str, flag: str) -> tuple[str, tuple]:
  """(spec, its ints) of one --flag entry: a `presets` name (none if empty) or `fields`
  (e.g. 'd:f:E:k'), as many positive ints joined by ':'."""
  if spec in presets:
    return spec, presets[spec]
  try:
    ints = tuple(int(v) for v in spec.split(":"))
  except ValueError:
    ints = ()
  if len(ints) != len(fields.split(":")) or min(ints) < 1:
    preset = f"a preset {sorted(presets)} or " if presets else ""
    raise ConfigError(f"{preset}{fields} of positive ints (--{flag}={spec})")
  return spec, ints


def flag_error(holder, expected: str) -> ConfigError:
  """ConfigError `expected ... (--name=value)` for a flag whose value main refuses."""
  return ConfigError(f"{expected} (--{holder.name}={holder.value})")
