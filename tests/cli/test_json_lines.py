"""cli_files.json_lines, the one reader of .jsonl inputs (--docs, --facts, --calibration):
records in order with blank lines skipped, and a one-line error naming the flag,
file and line for a line that is not JSON or lacks a string field; and the
calibration stream it feeds, against ids written out by hand."""

import numpy as np
import pytest

from moejax import cli_files
from moejax.errors import ConfigError
from moejax.posttrain import calibration


def write(tmp_path, text):
  path = tmp_path / "in.jsonl"
  path.write_text(text)
  return str(path)


def test_records_in_order_blank_lines_skipped(tmp_path):
  path = write(tmp_path, '{"text": "ab"}\n\n{"text": "c", "x": 1}\n')
  got = list(cli_files.json_lines("calibration", path, ("text",)))
  assert got == [
    (f"(--calibration={path}, line 1)", {"text": "ab"}),
    (f"(--calibration={path}, line 3)", {"text": "c", "x": 1}),
  ]


@pytest.mark.parametrize(
  "text, message",
  [
    ('{"text": "a"}\nnot json\n', "not a JSON line"),
    ('{"text": "a"}\n{"text": 3}\n', 'expected {"text": str}'),
    ('{"text": "a"}\n["text"]\n', 'expected {"text": str}'),
  ],
)
def test_a_bad_line_is_named(tmp_path, text, message):
  path = write(tmp_path, text)
  with pytest.raises(ConfigError, match="line 2") as error:
    list(cli_files.json_lines("calibration", path, ("text",)))
  assert message in str(error.value) and f"--calibration={path}" in str(error.value)


class Bytes:
  def encode(self, text):
    return list(text.encode())


def test_calibration_texts_are_their_bytes_each_followed_by_eos(tmp_path):
  path = write(tmp_path, '{"text": "ab"}\n{"text": "c"}\n')
  ids = calibration.calibration_stream(path, Bytes(), eos_id=7, vocab_size=256)
  np.testing.assert_array_equal(ids, [97, 98, 7, 99, 7])
  with pytest.raises(ConfigError, match=r"encodes to no tokens \(--calibration=.*line 2\)"):
    calibration.calibration_stream(
      write(tmp_path, '{"text": "a"}\n{"text": ""}\n'), Bytes(), eos_id=None
    )
  with pytest.raises(ConfigError, match=r"line 1"):
    calibration.calibration_stream(write(tmp_path, '{"text": "\u0100"}\n'), Bytes(), None, 100)
