"""The rotating share of `integration` tests (tests/helpers.py, tests/conftest.py):
every test falls in exactly one share of N, 'all' keeps each, 'none' none, and a bad
value is refused naming the option."""

import pytest

from tests.helpers import in_share, integration_share

IDS = [f"tests/area/test_file.py::test_case[{i}]" for i in range(1000)]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_each_test_is_in_exactly_one_share(n):
  shares = [integration_share(f"{k}/{n}") for k in range(n)]
  for nodeid in IDS:
    assert sum(in_share(nodeid, share) for share in shares) == 1, nodeid
  sizes = [sum(in_share(nodeid, share) for nodeid in IDS) for share in shares]
  # crc32 spreads the ids: each share within 5 binomial standard deviations of 1000/n.
  sd = (1000 * (1 / n) * (1 - 1 / n)) ** 0.5
  assert all(abs(size - 1000 / n) < 5 * sd for size in sizes), sizes


def test_all_keeps_every_test_and_none_keeps_none():
  assert all(in_share(nodeid, integration_share("all")) for nodeid in IDS)
  assert not any(in_share(nodeid, integration_share("none")) for nodeid in IDS)


@pytest.mark.parametrize("value", ["4/4", "a/b", "1", "", "-1/4", "1/0", "ALL"])
def test_a_bad_share_is_refused_naming_the_option(value):
  with pytest.raises(pytest.UsageError, match=r"^--integration-share: .*" + repr(value)):
    integration_share(value)
