"""mkdocs hook (mkdocs.yml `hooks:`): links from a page to a file of the repository
outside docs/ (a script, a config, a test) have no page on the site; they become
the file's repository path in code type. A link to a path that exists nowhere is
left alone, so `mkdocs build --strict` still fails on it.

Docstrings write array shapes in brackets (`H [rows, 2f]`, `z [T, 2n]`), which
markdown reads as a reference link and mkdocs-autorefs then reports as an
unknown cross-reference. A target with a comma or a space is a shape, never a
Python name: that report becomes info; any other unknown target stays a warning.
"""

import logging
import os
import re

SHAPE_REF = re.compile(r"Could not find cross-reference target '[^']*[, ][^']*'")


class _ShapesAreNotReferences(logging.Filter):
  def filter(self, record):
    if record.levelno == logging.WARNING and SHAPE_REF.search(record.getMessage()):
      record.levelno, record.levelname = logging.INFO, "INFO"
    return True


def on_config(config):
  logger = logging.getLogger("mkdocs.plugins.mkdocs_autorefs._internal.plugin")
  if not any(isinstance(f, _ShapesAreNotReferences) for f in logger.filters):
    logger.addFilter(_ShapesAreNotReferences())
  return config


LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
  docs_dir = os.path.realpath(config["docs_dir"])
  repo = os.path.dirname(docs_dir)
  page_dir = os.path.dirname(os.path.join(docs_dir, page.file.src_path))

  def rewrite(match):
    text, target = match.group(1), match.group(2)
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
      return match.group(0)  # a URL or a site-absolute link
    path = os.path.realpath(os.path.join(page_dir, target))
    inside_docs = path == docs_dir or path.startswith(docs_dir + os.sep)
    if inside_docs or not path.startswith(repo + os.sep) or not os.path.exists(path):
      return match.group(0)
    rel = os.path.relpath(path, repo)
    return f"`{rel}`" if text.strip("`") == rel else f"{text} (`{rel}`)"

  return LINK.sub(rewrite, markdown)
