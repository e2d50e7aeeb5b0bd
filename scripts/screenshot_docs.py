"""Screenshots of the built documentation site in headless Chromium: the
architecture page, the config reference and one method page.

    bash scripts/setup.sh --docs-screens      # playwright, and Chromium from Debian
    bash scripts/build_docs.sh --no-setup     # site/
    .venv/bin/python scripts/screenshot_docs.py [--out=/tmp/moejax-docs-screens]

Serves site/ on a local port and drives the system Chromium (/usr/bin/chromium)
through playwright; the PNGs are for looking at, not for committing.
"""

import argparse
import functools
import http.server
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = {
  "architecture": "architecture/",
  "config_reference": "reference/config/",
  "method_sere": "methods/sere/",
  "home": "",
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="/tmp/moejax-docs-screens")
  parser.add_argument("--site", default=os.path.join(ROOT, "site"))
  parser.add_argument("--chromium", default="/usr/bin/chromium")
  parser.add_argument("--width", type=int, default=1280)
  parser.add_argument("--height", type=int, default=900)
  parser.add_argument(
    "--full_page", action="store_true", help="the whole page, not the first screen"
  )
  args = parser.parse_args(argv)
  if not os.path.exists(os.path.join(args.site, "index.html")):
    print(
      f"error: no built site (--site={args.site}); run bash scripts/build_docs.sh", file=sys.stderr
    )
    return 2
  if not os.path.exists(args.chromium):
    print(
      f"error: no Chromium (--chromium={args.chromium}); run bash scripts/setup.sh --docs-screens",
      file=sys.stderr,
    )
    return 2
  from playwright.sync_api import sync_playwright

  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      pass

  handler = functools.partial(Quiet, directory=args.site)
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  base = f"http://127.0.0.1:{server.server_address[1]}/"
  os.makedirs(args.out, exist_ok=True)
  try:
    with sync_playwright() as p:
      browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
      page = browser.new_page(viewport={"width": args.width, "height": args.height})
      for name, path in PAGES.items():
        page.goto(base + path, wait_until="networkidle")
        out = os.path.join(args.out, f"{name}.png")
        page.screenshot(path=out, full_page=args.full_page)
        print(out)
      browser.close()
  finally:
    server.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
