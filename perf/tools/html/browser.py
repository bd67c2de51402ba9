"""Open a page in a real headless browser: Chromium's own ``--dump-dom`` and ``--screenshot``.

Used by the tests (the page loads without script errors and shows the right groups) and to make
the screenshot in docs/. The page reports its own errors in the DOM (``data-errors`` on the body,
an ``#errors`` list) and the browser prints every uncaught one as a ``CONSOLE`` line on stderr with
``--enable-logging=stderr``: both are read, so a page that throws before it can report is caught.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["PageLoad", "find_chromium", "load_page", "screenshot"]

# Ubuntu's chromium-browser is a snap, which cannot read the host's /tmp: last
_NAMES = ("chromium", "google-chrome", "google-chrome-stable", "chrome", "chromium-browser")
_CONSOLE = re.compile(r":CONSOLE[^\]]*\] \"(.*)\", source: (.*)$")


def find_chromium() -> str | None:
    """The browser to use: ``FUSEG_CHROMIUM``, else the first of Chromium's usual names on PATH."""
    env = os.environ.get("FUSEG_CHROMIUM")
    if env:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    return next((p for p in map(shutil.which, _NAMES) if p), None)


@dataclass
class PageLoad:
    """What the browser saw: the DOM after the page's scripts ran, and its console's errors."""

    dom: str
    console_errors: list[str]
    body: dict[str, str]  # the body element's attributes (data-ready, data-errors, ...)
    groups: list[dict[str, str]]  # every drawn segment group's attributes, in document order
    nodes: list[dict[str, str]]  # every drawn node's attributes
    page_errors: list[str]  # the page's own #errors list


class _Scan(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.groups: list[dict[str, str]] = []
        self.nodes: list[dict[str, str]] = []
        self.errors: list[str] = []
        self._in_errors = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "body":
            self.body = a
        elif tag == "g" and "seg" in classes:
            self.groups.append(a)
        elif tag == "g" and "node" in classes:
            self.nodes.append(a)
        elif tag == "ul" and a.get("id") == "errors":
            self._in_errors = 1
        elif tag == "li" and self._in_errors:
            self.errors.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul":
            self._in_errors = 0

    def handle_data(self, data: str) -> None:
        if self._in_errors and self.errors:
            self.errors[-1] += data


def _run(browser: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="fuseg-chromium-") as profile:  # a profile per run: tests run side by side
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _url(path: str | Path, fragment: str) -> str:
    return Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else "")


def load_page(path: str | Path, fragment: str = "", browser: str | None = None, timeout: float = 120.0,
              budget_ms: int = 30000) -> PageLoad:
    """Load ``path`` (with ``#fragment``) and return the DOM after its scripts ran."""
    browser = browser or find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium found (install chromium, or set FUSEG_CHROMIUM)")
    done = _run(browser, [f"--virtual-time-budget={budget_ms}", "--dump-dom", _url(path, fragment)], timeout)
    console = []
    for line in done.stderr.splitlines():
        m = _CONSOLE.search(line)
        if m and ("Uncaught" in m.group(1) or "Error" in m.group(1)):
            console.append(f"{m.group(1)} ({m.group(2)})")
    if done.returncode != 0 and not done.stdout:
        raise RuntimeError(f"{browser} exited {done.returncode}: {done.stderr[-2000:]}")
    scan = _Scan()
    scan.feed(done.stdout)
    return PageLoad(done.stdout, console, scan.body, scan.groups, scan.nodes, scan.errors)


def screenshot(path: str | Path, out: str | Path, fragment: str = "", size: tuple[int, int] = (1500, 900),
               browser: str | None = None, timeout: float = 120.0) -> str:
    """A PNG of the page as a browser window of ``size`` shows it."""
    browser = browser or find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium found (install chromium, or set FUSEG_CHROMIUM)")
    out = str(Path(out).resolve())
    _run(browser, ["--hide-scrollbars", f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=10000",
                   f"--screenshot={out}", _url(path, fragment)], timeout)
    if not os.path.isfile(out):
        raise RuntimeError(f"{browser} wrote no screenshot")
    return out
