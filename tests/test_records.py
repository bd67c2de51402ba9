"""perf.records: the committed records load, the generated index and the README's results table are
up to date (so neither can drift from the records), and a malformed record is refused with the file
and field named (Note [records] in perf/records.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perf import records

ROOT = Path(__file__).resolve().parent.parent


def test_committed_records_load_and_name_their_machine():
    recs = records.load()
    assert len(recs) >= 20
    assert {r.machine.folder for r in recs} >= {"amd-epyc-zen4", "nvidia-h100"}
    for r in recs:
        assert re.match(r"\d{4}-\d{2}-\d{2}$", r.date) and r.command and r.what, r.path
    # the rule of a folder: at most ~80 files in all
    assert sum(1 for p in records.RESULTS.rglob("*") if p.is_file()) <= 80


def test_index_and_readme_table_are_what_the_command_generates():
    """``python -m perf.records --check``: exit 0 only if perf/results/README.md and the README's
    table between the results markers equal what the records generate."""
    done = subprocess.run([sys.executable, "-m", "perf.records", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    recs = records.load()
    readme = (ROOT / "README.md").read_text()
    table = records.table(recs)
    assert f"{records.BEGIN}\n{table}{records.END}" in readme
    assert (records.RESULTS / "README.md").read_text() == records.index(recs)
    # every machine of the table is named in it, and every record it links exists
    for link in re.findall(r"\]\((perf/results/[^)]+)\)", table):
        assert (ROOT / link).is_file(), link


def test_every_record_the_tree_cites_exists():
    """A path under perf/results/ named in code, tests, docs or the README is a committed file
    (placeholders such as ``<machine>`` aside)."""
    cited: set[str] = set()
    for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md"),
                 *(p for d in ("segmenter", "alias", "runtime", "perf", "tests") for p in (ROOT / d).rglob("*.py"))]:
        for m in re.finditer(r"perf/results/([A-Za-z0-9_.\-/]+)", path.read_text()):
            cited.add(m.group(1).rstrip(".,/"))
    missing = sorted(c for c in cited if c and not (records.RESULTS / c).exists())
    assert not missing, missing


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "results"
    shutil.copytree(records.RESULTS, dst)
    return dst


def _edit_record(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, field", [
    (lambda d: d["record"].pop("date"), "'date'"),
    (lambda d: d["record"].update(date="28 Nov"), "'record.date'"),
    (lambda d: d["record"].update(command=3), "'command'"),
    (lambda d: d.pop("record"), "'record'"),
    (lambda d: d["record"].update(attachments={"gone.log": "a log"}), "'record.attachments'"),
    (lambda d: d.setdefault("environment", {}).update(gpu="NVIDIA A100"), "'environment.gpu'"),
])
def test_a_malformed_record_is_refused_naming_file_and_field(tmp_path, change, field):
    results = _copy(tmp_path)
    victim = results / "nvidia-h100" / "issue44_run7" / "gpu_compiled_h100.json"
    _edit_record(victim, change)
    with pytest.raises(records.RecordError) as err:
        records.load(results)
    assert "nvidia-h100/issue44_run7/gpu_compiled_h100.json" in str(err.value)
    assert field in str(err.value)


def test_broken_json_a_stray_file_and_a_missing_machine_are_refused(tmp_path):
    results = _copy(tmp_path)
    (results / "amd-epyc-zen4" / "train_step_cpu.json").write_text("{not json")
    with pytest.raises(records.RecordError, match=r"amd-epyc-zen4/train_step_cpu.json: not valid JSON"):
        records.load(results)
    results = _copy(tmp_path / "b")
    (results / "amd-epyc-zen4" / "notes.log").write_text("x")
    with pytest.raises(records.RecordError, match=r"amd-epyc-zen4/notes.log: .*'record.attachments'"):
        records.load(results)
    results = _copy(tmp_path / "c")
    (results / "amd-epyc-zen4" / "machine.json").unlink()
    with pytest.raises(records.RecordError, match=r"amd-epyc-zen4/machine.json: missing"):
        records.load(results)


def test_a_table_field_missing_is_named(tmp_path):
    results = _copy(tmp_path)
    victim = results / "amd-epyc-zen4" / "train_step_protocol_cpu.json"
    _edit_record(victim, lambda d: d["summary"].pop("median_fuseg_over_eager"))
    with pytest.raises(records.RecordError, match=r"amd-epyc-zen4/train_step_protocol_cpu.json: .*median_fuseg_over_eager"):
        records.table(records.load(results))


def test_the_readme_needs_its_markers():
    with pytest.raises(records.RecordError, match="README.md"):
        records.with_table("# no markers\n", "| t |\n")
    text = f"a\n{records.BEGIN}\nold\n{records.END}\nb\n"
    assert records.with_table(text, "| new |\n") == f"a\n{records.BEGIN}\n| new |\n{records.END}\nb\n"
