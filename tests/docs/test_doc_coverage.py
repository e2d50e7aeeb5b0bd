"""Every registered router, expert type, dispatcher, loss, grouped matmul,
post-training method and study has its page in docs/methods/, and the generated
config reference is current."""

import importlib.util
import os

import pytest

from moejax import routing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


method_pages = load_script("method_pages")


def missing_pages() -> list[tuple[str, str]]:
  """(kind, name) of every registered part whose page does not exist or does not name it."""
  missing = []
  for kind, name in method_pages.registered():
    path = os.path.join(ROOT, "docs", "methods", method_pages.page_of(kind, name) + ".md")
    if not os.path.exists(path) or f"{kind} `{name}`" not in open(path).read():
      missing.append((kind, name))
  return missing


def test_every_registered_part_has_its_page():
  assert missing_pages() == []


def test_the_check_sees_every_kind():
  kinds = {kind for kind, _ in method_pages.registered()}
  assert kinds == set(method_pages.KINDS)


def test_a_registered_part_without_a_page_fails_the_check():
  spec = routing.ROUTERS.get("topk")
  with routing.ROUTERS.temporarily("undocumented_router", spec):
    assert missing_pages() == [("router", "undocumented_router")]
  assert missing_pages() == []


def test_a_study_config_without_a_page_fails_the_check(monkeypatch):
  names = method_pages.study_names() + ["undocumented_study"]
  monkeypatch.setattr(method_pages, "study_names", lambda: names)
  assert missing_pages() == [("study", "undocumented_study")]


def test_the_config_reference_is_current():
  reference = load_script("config_reference")
  with open(reference.OUT) as f:
    committed = f.read()
  assert committed == reference.render(), "run: .venv/bin/python scripts/config_reference.py"


@pytest.mark.parametrize(
  "text",
  [
    "`model.moe.top_k`",
    "`train.micro_batches`",
    "`sharding.all_to_all`",
    "`model.moe.sere` | `primary_slots=1`, `rho=0.5`",
    "`model.moe.losses.dpsl` | `alpha=",
    "`model.moe.routing.renormalize` | `True`",
  ],
)
def test_the_config_reference_names_keys_and_part_settings(text):
  assert text in open(load_script("config_reference").OUT).read()
