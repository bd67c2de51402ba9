"""The ``fuseg`` command line.

    fuseg segment TARGET [--explain] [--json] [--graph] [--max-ops N] [--no-horizontal] [--alias MODE] [--html FILE]
    fuseg export TARGET -o FILE.json     write the captured graph as JSON (the documented schema)
    fuseg export TARGET --format nvfuser -o FILE.py   each kernel segment as an nvFuser FusionDefinition, and run()
    fuseg run TARGET [--alias MODE] [--json] [--background-builds]   run it once and check it against
                                         eager; says which segments ran on generated kernels, which on torch
    fuseg profile [MODEL ...] [--format table|csv|json|markdown] [--out FILE] [--html FILE] [--real-size] [--shard I/N]
    fuseg profile --suite transformers [--filter RE] [--limit N] [--shard I/N] [--inductor] [--out FILE.json|csv|md|html]
    fuseg bench [MODEL ...] [--device cpu|cuda] [--backend B ...] [--inductor] [--out FILE.json]
    fuseg report BASELINE.json CURRENT.json [--threshold 0.1] [--html FILE]   exit 1 on a regression
    fuseg report merge A.json B.json ... --out ALL.json   join the shards of a sweep
    fuseg examples                       list the built-in examples

TARGET is ``hf:ARCH[:key=value,...]`` (a transformers architecture from its config: perf/hf.py), a JSON graph file, an nvFuser Python-frontend script (``FILE.py``, read as data, never
run), a built-in example name, or ``package.module:factory`` (a function of no arguments returning
``(fn_or_module, example_inputs)``). Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import warnings
from collections import Counter
from collections.abc import Sequence

from alias import apply_aliases
from segmenter import FusionGraph, GraphError, OpKind, SegmenterOptions, op_info, segment
from segmenter.formats.nvfuser.importer import NvFuserFusion, read_nvfuser
from segmenter.formats.serialize import dump, graph_to_dict
from segmenter.ir.ops import resolve_op
from segmenter.ir.symbolic import hinted
from segmenter.partition.explain import describe_segments, segmentation_to_dict

from .. import fusions, zoo
from ..targets import Target, TargetError, load_program
from .profile import profile, render, side_by_side
from .run import random_inputs, run_target

__all__ = ["main"]


def describe_ops(graph: FusionGraph) -> str:
    """Op kinds in the graph and the ops that will run on torch, with why."""
    kinds = Counter(op_info(n.op).kind for n in graph.nodes)
    lines = ["op kinds: " + ", ".join(f"{k.name}={kinds[k]}" for k in OpKind if kinds[k])]
    opaque = Counter(n.op for n in graph.nodes if op_info(n.op).kind == OpKind.OPAQUE)
    for op, count in sorted(opaque.items()):
        info = op_info(op)
        if info.known:
            note = info.reason
        elif resolve_op(op) is None:
            note = "UNKNOWN op: torch has no such op; the graph cannot be run"
        else:
            note = "UNKNOWN op: not in the op table, runs on torch"
        lines.append(f"  OPAQUE {op} x{count}: {note}")
    return "\n".join(lines)


def describe_nvfuser(fusion: NvFuserFusion) -> str:
    """What an nvFuser script's -1 dims became (Note [symbolic or bound sizes] in
    segmenter/formats/nvfuser/importer.py): symbols (their ranges and the plan's conditions are printed with
    the segments), or the sizes they were bound to."""
    if fusion.bound:
        lines = [f"nvFuser script: sizes from {fusion.bound_from}"]
        lines += [f"  %{s.input} (line {s.line}): symbolic dims {list(s.dims)} bound to {list(s.sizes)}"
                  for s in fusion.symbolic]
    else:
        hints = "default hints (17, then primes apart)" if fusion.bound_from == "default hints" else fusion.bound_from
        lines = [f"nvFuser script: -1 dims are symbols, hinted by {hints}"]
        for s in fusion.symbolic:
            pinned = any(isinstance(n, int) for n in s.sizes)
            lines.append(f"  %{s.input} (line {s.line}): dims {list(s.dims)} are [{', '.join(map(str, s.sizes))}]"
                         + (" (a number: the fusion's ops fix it, or its hint is 0 or 1)" if pinned else ""))
    lines += [f"  note: {n}" for n in fusion.notes]
    return "\n".join(lines)


def bound_at_hints(target: Target) -> Target:
    """``fuseg run`` runs one size: a script whose -1 dims are symbols is bound to random inputs of
    its layouts at the hints (a symbolic graph has no tensors to make)."""
    fusion = target.nvfuser
    if fusion is None or fusion.sizes is None:
        return target
    layouts = types.SimpleNamespace(name=fusion.graph.name, inputs=[dataclasses.replace(i, meta=hinted(i.meta))
                                                                     for i in fusion.graph.inputs])
    bound = read_nvfuser(fusion.source, random_inputs(layouts), name=fusion.graph.name, warn=False)
    return Target(bound.graph, nvfuser=bound)


def _export_nvfuser(graph: FusionGraph, mode: str, path: str) -> int:
    from runtime.nvfuser_export import export_nvfuser

    try:
        exported = export_nvfuser(apply_aliases(segment(graph), mode))
    except ValueError as e:  # a graph it cannot write (constants, an op argument of another kind)
        return _error(str(e))
    with open(path, "w", encoding="utf-8") as f:
        f.write(exported.script)
    kinds = Counter(s.kind.value for s in exported.segments)
    print(f"wrote {path}: {len(exported.segments)} segments ({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
          f"{len(exported.fusions)} as nvFuser fusions", file=sys.stderr)
    for s in exported.segments:
        if s.function is None and s.kind.value != "metadata":
            print(f"  segment {s.index} ({s.kind.value}) runs on torch: {s.reason}", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fuseg", description="fusion-segmenter: cut fusion graphs into one-kernel segments")
    sub = p.add_subparsers(dest="command", required=True)
    target_help = ("a JSON graph file, an nvFuser script FILE.py (read as data), a built-in example name "
                   "(fuseg examples), or package.module:factory")
    seg = sub.add_parser("segment", help="segment a graph and list the segments")
    seg.add_argument("target", help=target_help)
    seg.add_argument("--explain", action="store_true", help="inputs, outputs, bytes of each segment and why each boundary is there")
    seg.add_argument("--json", action="store_true", help="machine-readable: the graph and its segmentation")
    seg.add_argument("--graph", action="store_true", help="also print the graph node by node")
    seg.add_argument("--max-ops", type=int, default=None, help="most ops per segment (1: cut at every op)")
    seg.add_argument("--no-horizontal", action="store_true", help="no horizontal merging")
    seg.add_argument("--alias", choices=("post", "pre", "off"), default="post",
                     help="alias pass: post (after the cut, default), pre (graph outputs only, as fusers do today), off")
    seg.add_argument("--html", default=None, metavar="FILE.html",
                     help="write the segmentation as one self-contained page (every alias mode, --alias shown first)")
    exp = sub.add_parser("export", help="write a target's graph as JSON, or its segments as nvFuser fusions")
    exp.add_argument("target", help=target_help)
    exp.add_argument("-o", "--out", required=True, help="output file")
    exp.add_argument("--format", choices=("json", "nvfuser"), default="json",
                     help="json: the graph (the documented schema); nvfuser: each kernel segment as a "
                          "FusionDefinition script, with run(inputs) running the whole segmentation")
    exp.add_argument("--alias", choices=("post", "pre", "off"), default="post", help="alias pass (nvfuser format)")
    run = sub.add_parser("run", help="run a target end to end and check it against eager; says which way each "
                                     "segment ran (generated kernel or torch)")
    run.add_argument("target", help=target_help)
    run.add_argument("--alias", choices=("post", "pre", "off"), default="post")
    run.add_argument("--json", action="store_true")
    run.add_argument("--background-builds", action="store_true",
                     help="build the kernels in the background, as torch.compile(backend='fuseg') does for "
                          "inference: the call runs on torch the segments whose kernels are not built yet "
                          "(default: every kernel is built before the call)")
    prof = sub.add_parser("profile", help="segment, kernel and metadata counts per model, alias modes side by side")
    prof.add_argument("models", nargs="*", help="targets, hf:ARCH[:key=value,...] among them (default: every "
                                                "built-in example)")
    prof.add_argument("--suite", choices=("transformers",), default=None,
                      help="every architecture transformers ships (hf:ARCH), with a pass rate")
    prof.add_argument("--filter", default=None, metavar="RE", help="--suite: architectures whose name matches")
    prof.add_argument("--limit", type=int, default=None, help="--suite: the first N architectures (sorted)")
    prof.add_argument("--arch-timeout", type=float, default=300,
                      help="--suite: seconds one architecture may take before its row says so (default 300)")
    prof.add_argument("--shard", default=None, metavar="I/N", help="this machine's share of the sweep (1 <= I <= N); "
                      "--out FILE.json then writes a sweep record that 'fuseg report merge' joins")
    prof.add_argument("--real-size", action="store_true",
                      help="hf: targets at their config's own sizes, on the meta device (profiled, never run)")
    prof.add_argument("--format", choices=("table", "csv", "json", "markdown"), default="table")
    prof.add_argument("--out", default=None, help="write to this file instead of stdout")
    prof.add_argument("--inductor", action="store_true", help="also count Inductor's generated kernels (slow)")
    prof.add_argument("--plot", default=None, metavar="FILE.png", help="bar chart of kernels per model per mode")
    prof.add_argument("--html", default=None, metavar="FILE.html",
                      help="every model's segmentation on one self-contained page, with the table")
    rep = sub.add_parser("report", help="compare two fuseg bench records; exit 1 on a regression")
    rep.add_argument("baseline")
    rep.add_argument("current")
    rep.add_argument("--threshold", type=float, default=0.10,
                     help="relative slowdown of the median that counts as a regression (default 0.10)")
    rep.add_argument("--html", default=None, metavar="FILE.html", help="also write an HTML report with a plot")
    rep.add_argument("--floor-ms", type=float, default=5.0,
                     help="sweep records: a segmentation time must also grow by this many ms (default 5)")
    bench = sub.add_parser("bench", help="time eager, our runtime per alias mode and backend, and torch.compile")
    bench.add_argument("models", nargs="*", help="built-in examples (default: the runnable ones)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda where there is one")
    bench.add_argument("--mode", action="append", choices=("post", "pre", "off"), help="alias modes (default: all)")
    bench.add_argument("--backend", action="append", help="backends (auto, torch, cupy, nvfuser, cpp; default: auto)")
    bench.add_argument("--inductor", action="store_true", help="also torch.compile (Inductor); slow to compile")
    bench.add_argument("--repeat", type=int, default=50)
    bench.add_argument("--warmup", type=int, default=5)
    bench.add_argument("--out", default=None, help="write the JSON record here")
    bench.add_argument("--shard", default=None, metavar="I/N", help="this machine's share of the models")
    sub.add_parser("examples", help="list the built-in examples")
    thr = sub.add_parser("threads", help="this machine's thread thresholds for generated CPU kernels "
                                         "(measured once and kept; Note [thread thresholds measured here])")
    thr.add_argument("--measure", action="store_true", help="measure them again and keep the new ones")
    thr.add_argument("--json", action="store_true", help="the thresholds and every median they came from")
    return p


def _threads(measure: bool, as_json: bool) -> int:
    import torch

    from runtime.codegen import calibrate, thresholds, vector_width

    n = torch.get_num_threads()
    try:
        t = thresholds.resolve(n)  # (the setting, else the kept ones, else measured now and kept)
    except ValueError as e:
        return _error(str(e))
    if measure and t.how == "kept":
        print(f"measuring on {n} threads ...", file=sys.stderr)
        t, detail = calibrate.measure(n)
        calibrate.keep(n, t, detail)  # (not where it was disturbed)
    elif t.how == "disturbed":
        detail = calibrate.last_detail(n)
    else:
        detail = calibrate.kept_detail(n) if t.how in ("kept", "measured") else {}
    width = vector_width.describe()  # (Note [a vector width measured here])
    if as_json:
        print(json.dumps({"threads": n, **{k: getattr(t, k) for k in calibrate.FIELDS}, "how": t.how,
                          "path": calibrate.thresholds_path(n), "measured": detail, "vector_width": width}, indent=1))
        return 0
    where = {"set": "set by FUSEG_THREAD_THRESHOLDS", "unmeasured": "not measured (one thread)",
             "disturbed": f"disturbed (not kept): another process took the cores while they were measured "
                          f"{detail.get('attempts', 1)} times; the unmeasured ones, and the next process "
                          f"measures again"}.get(t.how, f"{t.how}, in {calibrate.thresholds_path(n)}")
    print(f"thread thresholds on {n} threads ({where}):")
    print(f"  a loop takes the threads from {t.loop} elements of work, a product from {t.macs} multiply-adds")
    print(f"  a kernel may run beside others below {t.beside_loop} elements, {t.beside_macs} multiply-adds")
    print(f"  an exp, tanh or erf counts as {t.costly_call} plain ops of a loop's element")
    print(f"  a product copies B first from {t.pack_rows} rows (B along k), {t.nn_pack_rows} rows (B along n)")
    for line in detail.get("disturbed", []) if t.how == "disturbed" else []:
        print(f"  disturbed: {line}")
    ratio = f", the wide build {width['wide_over_native']:.2f}x the other's time" if "wide_over_native" in width else ""
    prefer = "512-bit vectors" if width["width"] == 512 else "the compiler's own vector width"
    print(f"kernels' loops prefer {prefer} ({width['how']}{ratio})")
    return 0


def _print_run(result: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        ok = result["aliasing_agrees"] and result["mutated_inputs_agree"] and result["strides_agree"]
        print(f"{result['graph']} ({result['alias_mode']}): {result['kernels']} kernels, {result['launches']} launches, "
              f"{result['metadata']} metadata ops")
        print(f"  against {result['reference']}: max abs diff {result['max_abs_diff']:.3g}, "
              f"max rel diff {result['max_rel_diff']:.3g}, strides {'agree' if result['strides_agree'] else 'DIFFER'}, "
              f"aliasing {'agrees' if result['aliasing_agrees'] else 'DIFFERS'}, mutated inputs "
              f"{'agree' if result['mutated_inputs_agree'] else 'DIFFER'}")
        print(f"  peak memory: ours {result['peak_bytes_ours']} B (modeled {result['peak_bytes_modeled']} B), "
              f"eager {result['peak_bytes_eager']} B")
        print(f"  ran: {result['ran']}; kernels built {result['builds']}")
        for f in result["fallbacks"]:
            print(f"  fallback: {f}")
        if not ok:
            return 1
    return 0


def _error(message: str) -> int:
    print(f"fuseg: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _merge(argv: Sequence[str]) -> int:
    from ..shards import ShardError, merge

    p = argparse.ArgumentParser(prog="fuseg report merge", description="join the shards' records of one sweep")
    p.add_argument("records", nargs="+", help="the shards' --out FILE.json records")
    p.add_argument("--out", required=True, help="the merged record")
    p.add_argument("--allow-missing", action="store_true", help="merge even where some shards are missing")
    args = p.parse_args(argv)
    try:
        merged = merge(args.records, allow_missing=args.allow_missing)
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=1)
            f.write("\n")
    except (ShardError, OSError) as e:
        return _error(str(e))
    print(f"wrote {args.out}: {len(merged['rows'])} rows from shards {merged['shards']} of {merged['shard_count']}",
          file=sys.stderr)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from ..shards import ShardError, parse_shard, record, select

    try:
        shard = parse_shard(args.shard) if args.shard else None
        if args.suite:
            from .suite import names, run_suite, summary, write_table

            everything = names(args.filter, args.limit)
            df = run_suite(select(everything, shard), real_size=args.real_size, inductor=args.inductor,
                           timeout=args.arch_timeout)
            print(summary(df))
            sweep, rows_all = f"suite:{args.suite}", everything
        else:
            everything = args.models or [*zoo.ZOO, *fusions.FUSIONS]
            records: list[dict] = []
            keep = None
            if args.html:
                from .html import graph_data

                def keep(name: str, sf: object, plans: dict) -> None:
                    records.append(graph_data({m: plans[m] for m in ("post", "pre", "off")}, name=name, base=sf))
            df = profile(select(everything, shard) if shard else everything, inductor=args.inductor,
                         real_size=args.real_size, keep=keep)
            sweep, rows_all = "profile", everything
            if args.html:
                from .html import write_page

                write_page(records, args.html, "fuseg profile", table=json.loads(df.to_json(orient="records")))
                print(f"wrote {args.html}: {len(records)} graphs", file=sys.stderr)
        if args.plot:
            from .profile import plot_kernels

            plot_kernels(df[df["status"] == "ok"] if "status" in df else df, args.plot)
        if args.out and args.out.endswith(".json") and (args.suite or shard):
            rows = json.loads(df.to_json(orient="records"))
            options = {"real_size": args.real_size, "inductor": args.inductor, "filter": args.filter,
                       "limit": args.limit}
            with open(args.out, "w") as f:
                json.dump(record(sweep, rows_all, shard, rows, options), f, indent=1)
                f.write("\n")
            return 0
        if args.suite:
            if args.out:
                write_table(df, args.out)
            return 0
        text = render(df, args.format)
        if args.format == "table" and side_by_side(df):
            text += "\n\n" + side_by_side(df)
    except KeyError as e:
        return _error(str(e.args[0]))
    except (GraphError, TargetError, ShardError, OSError) as e:
        return _error(str(e))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["report", "merge"]:
        return _merge(argv[2:])
    args = _parser().parse_args(argv)
    if args.command == "examples":
        for e in zoo.ZOO.values():
            print(f"{e.name:14s} B={e.batch:<3d} T={e.seq:<5d} {str(e.dtype).removeprefix('torch.'):9s} {e.description}")
        for f in fusions.FUSIONS.values():
            print(f"{f.name:14s} nvFuser script perf/fusions/{f.file}: {f.description}")
        return 0
    if args.command == "threads":
        return _threads(args.measure, args.json)
    if args.command == "bench":
        import torch

        from ..bench import run_bench

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        # meta RoPE inputs are materialized on a GPU; meta weights (real-size transformers) never are
        models = args.models or [n for n, e in zoo.ZOO.items() if not any(w in e.description for w in (
            ("large", "meta") if device == "cpu" else ("meta",))) or (device == "cuda" and n.startswith("rope-"))]
        try:
            from ..shards import ShardError, parse_shard, select

            shard = parse_shard(args.shard) if args.shard else None
        except ShardError as e:
            return _error(str(e))
        try:
            result = run_bench(select(models, shard), device, args.out, shard=(shard, models), modes=tuple(args.mode or ("post", "pre", "off")),
                               backends=tuple(args.backend or ("auto",)), inductor=args.inductor,
                               repeat=args.repeat, warmup=args.warmup)
        except (GraphError, TargetError, ValueError, OSError) as e:
            return _error(str(e))
        bad = [f"{r['model']}/{r['variant']}" for r in result["rows"] if r.get("ok") is False]
        if not args.out:
            print(json.dumps(result, indent=1))
        if bad:
            print(f"fuseg: outputs differ from eager: {', '.join(bad)}", file=sys.stderr)
            return 1
        return 0
    if args.command == "report":
        from .report import ReportError, compare, render_html, render_markdown
        from .sweep_report import compare_sweeps, is_sweep

        try:
            if is_sweep(args.baseline) or is_sweep(args.current):
                rep = compare_sweeps(args.baseline, args.current, args.threshold, args.floor_ms)
            else:
                rep = compare(args.baseline, args.current, args.threshold)
            print(render_markdown(rep))
            if args.html:
                render_html(rep, args.html)
        except (ReportError, OSError) as e:
            return _error(str(e))
        return 1 if rep.regressions else 0
    if args.command == "profile":
        return _profile(args)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation noise
            target = load_program(args.target)
        graph = target.graph
        if args.command == "run":
            return _print_run(run_target(bound_at_hints(target), args.alias, background_builds=args.background_builds),
                              args.json)
        if args.command == "export":
            if args.format == "nvfuser":
                return _export_nvfuser(graph, args.alias, args.out)
            dump(graph, args.out)
            print(f"wrote {args.out}: {len(graph.nodes)} nodes", file=sys.stderr)
            return 0
        if args.max_ops is not None and args.max_ops < 1:
            return _error("--max-ops must be at least 1")
        options = SegmenterOptions(max_ops_per_segment=args.max_ops, allow_horizontal=not args.no_horizontal)
        base = segment(graph, options)
        sf = apply_aliases(base, args.alias)
    except (GraphError, TargetError, OSError) as e:
        return _error(str(e))
    if args.html:
        from .html import write_html

        try:
            write_html(base, args.html, initial=args.alias)
        except OSError as e:
            return _error(str(e))
        print(f"wrote {args.html}: {len(graph.nodes)} nodes, {len(sf.segments)} segments ({args.alias})", file=sys.stderr)
        if not (args.json or args.explain or args.graph):
            return 0
    if args.json:
        record = {"graph": graph_to_dict(graph), "segmentation": segmentation_to_dict(sf)}
        if target.nvfuser is not None:  # what the script's -1 dims became
            record["nvfuser"] = {"bound": target.nvfuser.bound, "bound_from": target.nvfuser.bound_from,
                                 "notes": list(target.nvfuser.notes),
                                 "symbolic": [{"input": s.input, "line": s.line, "dims": list(s.dims),
                                               "sizes": list(s.sizes)} for s in target.nvfuser.symbolic]}
        print(json.dumps(record, indent=1))
        return 0
    if args.graph:
        print(graph, end="\n\n")
    print(describe_segments(sf, explain=args.explain))
    if args.explain:
        print(sf.alias_report)
    print(describe_ops(graph))
    if target.nvfuser is not None:
        print(describe_nvfuser(target.nvfuser))
    return 0


if __name__ == "__main__":
    sys.exit(main())
