"""Run Python on simulated CPU devices in child processes, and always clean them up.

The main test session keeps one device; checks that need 8 (or 2 x 4 across
processes) run in children started with
XLA_FLAGS=--xla_force_host_platform_device_count=N, set before jax is imported.
"""

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


_CACHE_DIR = []


def compilation_cache_dir() -> str:
  """The persistent XLA compilation cache of the children: the test run's own
  (scripts/test.sh makes one for all its workers) when set, so the same program on
  the same devices compiles once whichever worker starts it; else one for this
  session, removed at exit."""
  if not _CACHE_DIR:
    run_cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if run_cache:
      _CACHE_DIR.append(run_cache)
    else:
      _CACHE_DIR.append(tempfile.mkdtemp(prefix="moejax-test-xla-cache-"))
      atexit.register(shutil.rmtree, _CACHE_DIR[0], ignore_errors=True)
  return _CACHE_DIR[0]


def device_env(num_devices: int) -> dict:
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_COMPILATION_CACHE_DIR=compilation_cache_dir(),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  flags = [
    f
    for f in env.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={num_devices}"])
  return env


def run(args, num_devices: int, timeout: float, env=None) -> subprocess.CompletedProcess:
  """`python args...` in the repo on num_devices devices (and `env` set); output
  captured (a timeout kills it)."""
  return subprocess.run(
    [sys.executable, *args],
    cwd=REPO,
    env={**device_env(num_devices), **(env or {})},
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    timeout=timeout,
  )


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def started(commands, num_devices: int, log_dir: str):
  """Start one child per argument list (output to log_dir/<i>.log); kill the ones
  still running on exit, whether the body passed or failed."""
  procs = []
  try:
    for i, args in enumerate(commands):
      log = open(os.path.join(log_dir, f"{i}.log"), "w")
      procs.append(
        subprocess.Popen(
          [sys.executable, *args],
          cwd=REPO,
          stdout=log,
          stderr=subprocess.STDOUT,
          env=device_env(num_devices),
        )
      )
      log.close()
    yield procs
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
      proc.wait()


def tail(path: str, chars: int = 4000) -> str:
  with open(path) as f:
    return f.read()[-chars:]
