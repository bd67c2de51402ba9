"""The README's examples run and print what the README says they print, so the page stays honest:
its Python blocks (run in a fresh process, as a user would paste them) and its `fuseg segment`
transcripts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    """The bodies of the README's fenced blocks of one language ("" for plain ones)."""
    return [body for tag, body in re.findall(r"^```(\w*)\n(.*?)^```$", README, flags=re.S | re.M) if tag == lang]


def test_the_python_blocks_run_and_print_what_the_readme_shows():
    code = _blocks("python")
    assert len(code) >= 3  # torch.compile, the fx partitioner, the Python API
    script = "\n\n".join(f"def _block_{i}():\n" + "".join(f"    {line}\n" for line in block.splitlines())
                         + f"_block_{i}()" for i, block in enumerate(code))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    shown = re.search(r"It prints:\n\n```\n(.*?)```", README, flags=re.S)
    assert shown is not None
    for line in shown.group(1).splitlines():
        assert line in out, (line, out)
    fx = re.search(r"This prints `([^`]*)`", README)
    assert fx is not None and fx.group(1) in out
    assert "ok torch.Size([256, 64])" in out


@pytest.mark.parametrize("command", ["fuseg segment nvfuser-2577 | cut -c1-100",
                                     "fuseg segment rope-seed --explain | cut -c1-100"])
def test_the_segment_transcripts_are_real(command):
    block = next(b for b in _blocks("") if b.startswith(f"$ {command}\n"))
    want = block.splitlines()[1:]
    args = command.split(" | ")[0].split()[1:]
    done = subprocess.run([sys.executable, "-m", "perf.tools.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line[:100] for line in done.stdout.splitlines()] == want
