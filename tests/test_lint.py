"""The whole tree is ``ruff check`` clean (pyproject.toml's rules); skipped where ruff is not installed
(it is in setup.py's test extra)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (pip install ruff)")
def test_ruff_check_is_clean() -> None:
    done = subprocess.run(["ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
