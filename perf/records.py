"""The committed records: an index of them and the README's results table, both generated.

    python -m perf.records            # rewrite perf/results/README.md and the README's table
    python -m perf.records --check    # exit 1 if either is out of date (what tests/test_records.py runs)

Note [records]: perf/results/ holds one folder per machine kind (``amd-epyc-zen4/``,
``nvidia-h100/``, ...), each with a ``machine.json`` naming the machine. Every other ``*.json``
under a machine's folder is a record: a JSON object whose ``"record"`` field says what it
measures (``what``), when (``date``, YYYY-MM-DD), at which commit (``commit``, or null), and the
command that made it (``command``); ``attachments`` names the non-JSON files of the same folder
(logs, notes) that belong to it, and ``row`` puts the record in the README's results table under
that name (the latest record of a row on each machine wins). A record whose environment names
its CPU or GPU must match its folder's machine. A record is not rewritten when the code that
made it changes: a command or path inside it is the one of its day.

To add a record: run the benchmark with ``--out perf/results/<machine>/<name>.json``, add the
``"record"`` field by hand, and run ``python -m perf.records``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class RecordError(ValueError):
    """A malformed record or machine folder; the message names the file and the field."""


@dataclass(frozen=True)
class Machine:
    folder: str
    name: str
    cpu: str | None
    gpu: str | None
    about: str


@dataclass(frozen=True)
class Record:
    path: str  # relative to perf/results/
    machine: Machine
    what: str
    date: str
    commit: str | None
    command: str
    row: str | None
    attachments: dict[str, str]
    data: dict[str, Any]


def _field(where: str, obj: dict[str, Any], name: str, kind: type, optional: bool = False) -> Any:
    if name not in obj:
        if optional:
            return None
        raise RecordError(f"{where}: missing field '{name}'")
    value = obj[name]
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        raise RecordError(f"{where}: field '{name}' must be {kind.__name__}, not {type(value).__name__}")
    return value


def _load_json(path: Path, rel: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RecordError(f"{rel}: not valid JSON ({e})") from None


def load_machine(folder: Path) -> Machine:
    rel = f"{folder.name}/machine.json"
    if not (folder / "machine.json").is_file():
        raise RecordError(f"{rel}: missing (every machine folder names its machine)")
    m = _load_json(folder / "machine.json", rel)
    if not isinstance(m, dict):
        raise RecordError(f"{rel}: must be a JSON object")
    return Machine(folder.name, _field(rel, m, "name", str), _field(rel, m, "cpu", str, True),
                   _field(rel, m, "gpu", str, True), _field(rel, m, "about", str))


def _check_machine(rel: str, data: dict[str, Any], machine: Machine) -> None:
    env = data.get("environment")
    if not isinstance(env, dict):
        return
    for key, want in (("cpu", machine.cpu), ("gpu", machine.gpu)):
        got = env.get(key)
        if isinstance(got, str) and want is not None and not got.startswith(want):
            raise RecordError(f"{rel}: field 'environment.{key}' is {got!r}, not the folder's machine ({want!r})")


def load_record(path: Path, machine: Machine, results: Path = RESULTS) -> Record:
    rel = path.relative_to(results).as_posix()
    data = _load_json(path, rel)
    if not isinstance(data, dict):
        raise RecordError(f"{rel}: a record must be a JSON object with a 'record' field")
    head = _field(rel, data, "record", dict)
    where = f"{rel}: record"
    date = _field(where, head, "date", str)
    if not _DATE.match(date):
        raise RecordError(f"{rel}: field 'record.date' must be YYYY-MM-DD, not {date!r}")
    attachments = _field(where, head, "attachments", dict, optional=True) or {}
    for name in attachments:
        if not (path.parent / name).is_file():
            raise RecordError(f"{rel}: field 'record.attachments' names {name!r}, which is not in {path.parent.name}/")
    _check_machine(rel, data, machine)
    return Record(rel, machine, _field(where, head, "what", str), date, _field(where, head, "commit", str, True),
                  _field(where, head, "command", str), _field(where, head, "row", str, True), dict(attachments), data)


def load(results: Path = RESULTS) -> list[Record]:
    """Every record under ``results``, checked (RecordError names the file and field)."""
    records: list[Record] = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        machine = load_machine(folder)
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "machine.json")
        folder_records = [load_record(p, machine, results) for p in files if p.suffix == ".json"]
        attached = {(Path(r.path).parent / a).as_posix() for r in folder_records for a in r.attachments}
        for p in files:
            rel = p.relative_to(results).as_posix()
            if p.suffix != ".json" and rel not in attached:
                raise RecordError(f"{rel}: not a record and no record of its folder lists it in 'record.attachments'")
        records += folder_records
    stray = [p.name for p in results.iterdir() if p.is_file() and p.name != "README.md"]
    if stray:
        raise RecordError(f"{stray[0]}: records live in a machine's folder (perf/results/<machine>/)")
    return records


# --- the README's table: one headline per kind of record -------------------------------------

def _x(v: float) -> str:
    return f"{v:.2f}x"


def _span(vs: list[float]) -> str:
    vs = [v for v in vs if v is not None]
    if not vs:
        return "-"
    return _x(vs[0]) if len(vs) == 1 or min(vs) == max(vs) else f"{min(vs):.2f}-{max(vs):.2f}x"


def _protocol_also(s: dict[str, Any]) -> list[str]:
    """A summary's Note [the protocol] (perf.compiled.protocol_summary) for the "Also" column."""
    p = s.get("protocol")
    if not p:
        return []
    e, i = p["median_fuseg_vs_eager"], p["median_fuseg_vs_inductor"]
    out = []
    if e.get("window") is not None or i.get("window") is not None:
        out.append(f"first {p['window_s']:g} s after the first call {_ratio_pair(e.get('window'), i.get('window'))}")
    if i.get("first_call") is not None:
        out.append(f"first call {_x(i['first_call'])} Inductor's (one process)")
    return out


def _compiled(d: dict[str, Any]) -> tuple[str, str, str, str]:
    s = d["summary"]["all"]
    other = _protocol_also(s)
    if s.get("median_first_call_vs_inductor") is not None and not s.get("protocol"):
        other.append(f"first call {_x(s['median_first_call_vs_inductor'])} Inductor's")
    if s.get("median_fuseg_graphs_vs_inductor") is not None:
        other.append(f"with CUDA graphs {_x(s['median_fuseg_graphs_vs_inductor'])} Inductor's")
    if s.get("median_fuseg_graphs_vs_inductor_ro") is not None:
        other.append(f"{_x(s['median_fuseg_graphs_vs_inductor_ro'])} Inductor's with its CUDA graphs (reduce-overhead)")
    return (f"{s['models']} models", _x(s["median_fuseg_vs_eager"]), _x(s["median_fuseg_vs_inductor"]),
            "; ".join(other) or "-")


def _train_step(d: dict[str, Any]) -> tuple[str, str, str, str]:
    s = d["summary"]
    return (f"{len(d['results'])} models", _x(s["median_fuseg_over_eager"]), _x(s["median_fuseg_over_inductor"]),
            "; ".join([*_protocol_also(s), f"gradients within {s['max_grad_diff']:.1e} of eager's"]))


def _generate_protocol(d: dict[str, Any]) -> tuple[str, str, str, str]:
    s = d["summary"]["protocol"]
    e, i = s["median_fuseg_vs_eager"], s["median_fuseg_vs_inductor"]
    return (f"{len(d['results'])} models", _x(e["settled"]) if e.get("settled") is not None else "-",
            _x(i["settled"]) if i.get("settled") is not None else "-",
            "settled generate; " + "; ".join(_protocol_also(d["summary"])))


def _rounds(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for v in d["results"].values() for r in v["rounds"]]


def _train_lengths(d: dict[str, Any]) -> tuple[str, str, str, str]:
    rs = _rounds(d)
    return (f"{len(d['results'])} models, {len(rs)} runs", _span([r["ratios"]["fuseg_over_eager"] for r in rs]),
            _span([r["ratios"]["fuseg_over_inductor"] for r in rs]), "settled step; nothing recompiled per length")


def _generate(d: dict[str, Any]) -> tuple[str, str, str, str]:
    rs = [r["ratios"] for r in _rounds(d)]
    return (f"{len(d['results'])} models, {len(rs)} runs", "-",
            _span([r["fuseg_settled_after_builds_over_inductor"] for r in rs]),
            f"settled generate; first generate {_span([r['fuseg_first_over_inductor'] for r in rs])} Inductor's")


def _bandwidth(d: dict[str, Any]) -> tuple[str, str, str, str]:
    cases = d["summary"]["cases"].values()
    return (f"{len(d['summary']['cases'])} blocks", _span(sorted(c["fuseg_vs_eager"] for c in cases)),
            _span(sorted(c["fuseg_vs_inductor"] for c in cases)),
            f"time of a copy of the same bytes: {_span(sorted(c['fuseg_vs_copy'] for c in cases))}")


def _profile(d: dict[str, Any]) -> tuple[str, str, str, str]:
    rows = [r for r in d["rows"] if r.get("inductor_kernels")]
    ratio = statistics.median(r["post_kernels"] / r["inductor_kernels"] for r in rows)
    return (f"{len(d['rows'])} models", "-", "-",
            f"our kernels per forward (post mode, matmuls and ATen ops included) over Inductor's generated "
            f"kernels: median {ratio:.2f}x ({len(rows)} models Inductor ran)")


def _reductions(d: dict[str, Any]) -> tuple[str, str, str, str]:
    s = d.get("summary", {})
    if "as_built_over_chunked" in s:  # (the three ways of perf.reductions, both tables)
        acc = d.get("accuracy_summary", {})
        return (f"{len(d.get('accuracy', []))} reductions (error), {len(d['speed'])} (time)", "-", "-",
                f"error against float64: {acc.get('as built', '-')}; as built over chunked "
                f"{_span(s['as_built_over_chunked']['range'])} where the source differs, "
                f"{_span(s['as_built_over_chunked_same_source']['range'])} where it is the same (noise)")
    if d.get("accuracy"):
        return (f"{len(d['accuracy'])} reductions, 2^12..2^26 elements", "-", "-",
                f"error against float64: {d['accuracy_summary']['chunked']}")
    rows = d["speed"]
    return (f"{len(rows)} row and column reductions", "-", "-",  # (kernels forced: no choice against ATen here)
            f"chunked over one loop {_span(s['chunked_over_one_loop_range'])} where the source differs, "
            f"{_span(s['same_source_control_range'])} where it is the same (noise)")


def _kind(d: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[str, str, str, str]] | None:
    bench = str(d.get("benchmark", ""))
    if bench == "reductions":
        return _reductions
    if bench.startswith("compiled models"):
        return _compiled
    if bench.startswith("dynamic_shapes/train"):
        return _train_lengths
    if bench == "dynamic_shapes/generate-protocol":
        return _generate_protocol
    if bench.startswith("dynamic_shapes/generate"):
        return _generate
    if "median_fuseg_over_inductor" in d.get("summary", {}):
        return _train_step
    if "cases" in d.get("summary", {}) and "targets_vs_copy" in d["summary"]:
        return _bandwidth
    if isinstance(d.get("rows"), list) and d["rows"] and "post_kernels" in d["rows"][0]:
        return _profile
    return None


def _headlines(records: list[Record]) -> list[Record]:
    """The latest record of each row on each machine."""
    latest: dict[tuple[str, str], Record] = {}
    for r in records:
        if r.row is None:
            continue
        key = (r.row, r.machine.folder)
        if key in latest and latest[key].date == r.date:
            raise RecordError(f"{r.path}: field 'record.row' {r.row!r} has two records of {r.date} on one machine")
        if key not in latest or latest[key].date < r.date:
            latest[key] = r
    return list(latest.values())


# Note [the speed table]: the speed tables put the CPU kinds side by side: one column per machine
# folder whose machine.json names a CPU and no GPU (a CPU kind). The README's has a row per
# workload (the median and the worst of its models); the records' index (perf/results/README.md)
# one row per workload and model. Both are read from the headline records (those with a ``row``; the latest of a row on a machine)
# of the speed benchmarks: perf.compiled (inference; a record of ``--dtype bfloat16`` or ``float16`` is a
# workload of its own), perf.train_step (a training step),
# perf.dynamic_shapes (training on changing lengths, generation). A cell holds fuseg/eager and
# fuseg/Inductor once settled and, where the record has Note [the protocol] in perf/compiled.py,
# the same two for the window of calls after the first (fuseg/eager there: the window's mean over
# the eager calls made among it, Note [eager at the same moments], or, in older records, over
# eager's settled time). Where two headline records of one machine hold a model of the same
# workload, the later one's figures stand. Older records without some ratio show "-".

#: the speed benchmarks' workloads, in the table's order
WORKLOADS = ("Inference", "Inference, bfloat16", "Inference, float16", "Training step", "Training, changing lengths",
             "Generation, new prompt lengths")


@dataclass(frozen=True)
class Speed:
    """One model's ratios in one record (None: not measured there)."""
    eager: float | None
    inductor: float | None
    window_eager: float | None = None
    window_inductor: float | None = None
    window_s: float | None = None


def _median(vals: list[Any]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def _with_protocol(settled: Speed, row: dict[str, Any]) -> Speed:
    p = row.get("protocol")
    if not isinstance(p, dict):
        return settled
    e, i = p.get("fuseg_vs_eager", {}), p.get("fuseg_vs_inductor", {})
    return Speed(e.get("settled", settled.eager), i.get("settled", settled.inductor), e.get("window"),
                 i.get("window"), p.get("window_s"))


def _speeds(d: dict[str, Any]) -> list[tuple[str, str, Speed]]:
    """(workload, model, ratios) of a speed record's models; nothing for other records."""
    bench = str(d.get("benchmark", ""))
    out: list[tuple[str, str, Speed]] = []
    if bench.startswith("compiled models") and "cuda" not in bench:
        dtype = d.get("dtype", "float32")  # (perf.compiled --dtype: a workload of its own, not float32's models)
        for r in d["rows"]:
            if "fuseg_vs_eager" in r or "protocol" in r:
                out.append(("Inference" if dtype == "float32" else f"Inference, {dtype}", r["model"],
                            _with_protocol(Speed(r.get("fuseg_vs_eager"), r.get("fuseg_vs_inductor")), r)))
    elif bench == "dynamic_shapes/train-interleaved":
        for name, v in d["results"].items():
            rs = [r.get("ratios", {}) for r in v["rounds"]]
            out.append(("Training, changing lengths", name, Speed(_median([r.get("fuseg_over_eager") for r in rs]),
                                                                 _median([r.get("fuseg_over_inductor") for r in rs]))))
    elif bench == "dynamic_shapes/generate-protocol":
        for name, v in d["results"].items():
            if "protocol" in v:
                out.append(("Generation, new prompt lengths", name, _with_protocol(Speed(None, None), v)))
    elif bench == "dynamic_shapes/generate":
        for name, v in d["results"].items():
            rs = [r.get("ratios", {}) for r in v.get("rounds", [v])]
            inductor = _median([r.get("fuseg_settled_after_builds_over_inductor", r.get("fuseg_steady_over_inductor"))
                                for r in rs])
            eager = _median([r.get("fuseg_steady_over_eager") for r in rs])
            if eager is not None or inductor is not None:
                out.append(("Generation, new prompt lengths", name, Speed(eager, inductor)))
    elif _kind(d) is _train_step:
        for r in d["results"]:
            if "error" not in r and "fuseg_over_eager" in r:
                out.append(("Training step", r["model"],
                            _with_protocol(Speed(r["fuseg_over_eager"], r.get("fuseg_over_inductor")), r)))
    return out


def _ratio_pair(e: float | None, i: float | None) -> str:
    return f"{_x(e) if e is not None else '-'} / {_x(i) if i is not None else '-'}"


def _cell(sp: Speed | None) -> str:
    if sp is None:
        return ""
    text = _ratio_pair(sp.eager, sp.inductor)
    if sp.window_eager is not None or sp.window_inductor is not None:
        text += f"; first {sp.window_s:g} s {_ratio_pair(sp.window_eager, sp.window_inductor)}"
    return text


def _speed_cells(records: list[Record]) -> tuple[dict[tuple[str, str], dict[str, Speed]], dict[str, list[Record]]]:
    """Each (workload, model)'s ratios per CPU kind's folder, and the records they came from."""
    headlines = sorted((r for r in _headlines(records) if r.machine.cpu is not None and r.machine.gpu is None),
                       key=lambda r: (r.date, r.path))
    cells: dict[tuple[str, str], dict[str, Speed]] = {}
    used: dict[str, list[Record]] = {}
    for r in headlines:
        try:
            found = _speeds(r.data)
        except (KeyError, TypeError, AttributeError, statistics.StatisticsError) as e:
            raise RecordError(f"{r.path}: a field the speed table reads is missing or malformed ({e!r})") from None
        for workload, model, sp in found:
            cells.setdefault((workload, model), {})[r.machine.folder] = sp  # (a later record's figures stand)
        if found:
            used.setdefault(r.machine.folder, []).append(r)
    return cells, used


def _sources(machines: list[Machine], used: dict[str, list[Record]]) -> str:
    return "; ".join(f"{m.name}: " + ", ".join(f"[{Path(r.path).name}](perf/results/{r.path}) ({r.date})"
                                             for r in sorted(used[m.folder], key=lambda r: r.path))
                     for m in machines)


def speed_table(records: list[Record]) -> str:
    """Note [the speed table], a row per model (the records' index holds it); empty where no CPU
    kind has a speed record."""
    cells, used = _speed_cells(records)
    if not cells:
        return ""
    machines = sorted({r.machine for rs in used.values() for r in rs}, key=lambda m: m.name)
    lines = ["Speed per CPU kind: fuseg/eager / fuseg/Inductor once settled; \"first N s\": the same for the mean "
             "call of the N seconds after the first call, against eager's calls made among them where the record "
             "has them (Note [the protocol] in `perf/compiled.py`).", "",
             "| Workload | Model | " + " | ".join(m.name for m in machines) + " |",
             "|---|---|" + "---|" * len(machines)]
    for (workload, model), per in sorted(cells.items(), key=lambda kv: (WORKLOADS.index(kv[0][0]), kv[0][1])):
        lines.append(f"| {workload} | {model} | " + " | ".join(_cell(per.get(m.folder)) for m in machines) + " |")
    return "\n".join([*lines, "", f"From: {_sources(machines, used)}.", ""]) + "\n"


def _summary_cell(speeds: list[Speed]) -> str:
    if not speeds:
        return ""
    def pair(es: list[float | None], is_: list[float | None], pick: Callable[[list[float]], float]) -> str:
        e, i = [v for v in es if v is not None], [v for v in is_ if v is not None]
        return _ratio_pair(pick(e) if e else None, pick(i) if i else None)
    text = (f"{pair([s.eager for s in speeds], [s.inductor for s in speeds], statistics.median)}, worst "
            f"{pair([s.eager for s in speeds], [s.inductor for s in speeds], max)} ({len(speeds)} models)")
    windows = [s for s in speeds if s.window_eager is not None or s.window_inductor is not None]
    if windows:
        we, wi = [s.window_eager for s in windows], [s.window_inductor for s in windows]
        text += f"; first {windows[0].window_s:g} s: {pair(we, wi, statistics.median)}, worst {pair(we, wi, max)}"
    return text


def speed_summary(records: list[Record]) -> str:
    """The README's speed table (Note [the speed table]): a row per workload, a column per CPU
    kind, the median and the worst of its models' ratios; empty where no CPU kind has a speed record."""
    cells, used = _speed_cells(records)
    if not cells:
        return ""
    machines = sorted({r.machine for rs in used.values() for r in rs}, key=lambda m: m.name)
    lines = ["Speed per CPU kind: fuseg/eager / fuseg/Inductor once settled, the median and the worst of a "
             "workload's models; \"first N s\": the same for the mean call of the N seconds after the first call, "
             "against eager's calls made among them where the record has them (Note [the protocol] in "
             "`perf/compiled.py`). Each model's figures: "
             "[perf/results/README.md](perf/results/README.md).", "",
             "| Workload | " + " | ".join(m.name for m in machines) + " |", "|---|" + "---|" * len(machines)]
    for workload in WORKLOADS:
        per = [[sp for (w, _), by in cells.items() if w == workload for f, sp in by.items() if f == m.folder]
               for m in machines]
        if any(per):
            lines.append(f"| {workload} | " + " | ".join(_summary_cell(sps) for sps in per) + " |")
    return "\n".join([*lines, "", f"From: {_sources(machines, used)}.", ""]) + "\n"


def table(records: list[Record]) -> str:
    lines = ["| Workload | Machine | Measured | fuseg / eager | fuseg / Inductor | Also | Record (date) |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(_headlines(records), key=lambda r: (r.row or "", r.machine.name)):
        kind = _kind(r.data)
        if kind is None:
            raise RecordError(f"{r.path}: field 'record.row' is set but no headline is known for this kind of record")
        try:
            measured, eager, inductor, also = kind(r.data)
        except (KeyError, TypeError, ZeroDivisionError) as e:
            raise RecordError(f"{r.path}: a field the table reads is missing or malformed ({e!r})") from None
        lines.append(f"| {r.row} | {r.machine.name} | {measured} | {eager} | {inductor} | {also} | "
                     f"[{Path(r.path).name}](perf/results/{r.path}) ({r.date}) |")
    return speed_summary(records) + "\n".join(lines) + "\n"


def index(records: list[Record]) -> str:
    out = ["# perf/results", "",
           "Generated by `python -m perf.records` from the records' own `record` fields: do not edit by hand.",
           "How a record is laid out and how to add one: Note [records] in `perf/records.py`. Records are",
           "history: a command or path inside one is that of its day. Older records are in git history.", ""]
    per_model = speed_table(records)
    if per_model:
        out += ["## Speed per model and CPU kind", "", per_model]
    machines: dict[str, Machine] = {}
    for r in records:
        machines.setdefault(r.machine.folder, r.machine)
    for folder, m in sorted(machines.items()):
        out += [f"## {m.name} (`{folder}/`)", "", m.about, "",
                "| Record | What it measures | Date | Commit | Command |", "|---|---|---|---|---|"]
        for r in sorted((r for r in records if r.machine.folder == folder), key=lambda r: r.path):
            name = r.path[len(folder) + 1:]
            what = r.what + "".join(f"; `{a}`: {t}" for a, t in sorted(r.attachments.items()))
            cmd = r.command.replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{name}` | {what} | {r.date} | {r.commit or '-'} | `{cmd}` |")
        out.append("")
    return "\n".join(out)


def with_table(readme: str, generated: str) -> str:
    """``readme`` with the text between the results markers replaced by ``generated``."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise RecordError(f"README.md: needs one '{BEGIN}' line and one '{END}' line after it")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.records", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the index or the README's table is out of date")
    args = ap.parse_args(argv)
    try:
        records = load(RESULTS)  # (the module's paths as they are now: a test points them at a copy)
        outputs = {RESULTS / "README.md": index(records), README: with_table(README.read_text(), table(records))}
    except RecordError as e:
        print(f"perf.records: {e}", file=sys.stderr)
        return 2
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"perf.records: {p.relative_to(ROOT)} is out of date: run python -m perf.records", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(outputs[p])
        print(f"wrote {p.relative_to(ROOT)}")
    print(f"{len(records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
