"""One training step (forward, backward, SGD update) under eager, Inductor and fuseg, at a fixed
shape: issue 42's goal 4.

    python -m perf.train_step [MODEL ...] [--rounds 5] [--steps 10] [--processes 1] [--protocol [--window 30]]
                              [--before /path/to/checkout [--repeats 2]] [--separate PAIRS [--floor]]
                              [--out perf/results/<machine>/train_step_cpu.json]

Models (``TRAIN_MODELS``): tiny causal LMs (hidden 64, 2 layers, batch 2, 32 tokens), mid-size
ones (hidden 256, 4 layers, batch 2, 128 tokens) and encoders with a masked-LM head, all from
``transformers`` configs with random weights (no download); labels are the inputs.

Method. Each model runs in a fresh process with empty Inductor and fuseg caches. There each
variant gets its own copy of the same weights and ``torch.compile``s it (default options); the
first step of each is timed (the compile). Eager comes first; Inductor and fuseg swap places
from one process to the next (Inductor first in the first process; the process's own warm-up
lands on the first), because in one process two identical variants differed by 3-6% with the
order they were made in (an A/A trial of ``perf.experiments.embedding_backward``): with
``--processes`` even, each order runs as often. Then one step of each on the same batch from the same weights is checked against eager:
the loss and every parameter's gradient. Then the variants' steps are timed in ``--rounds``
interleaved blocks of ``--steps`` steps each (``opt.zero_grad(); loss = model(...).loss;
loss.backward(); opt.step()``, ``perf_counter`` per step); the record keeps each variant's median
step. ``--processes N`` runs each model so in N fresh processes, one after another: the row is
each variant's median over them and the median of their fuseg/Inductor ratios, every process
kept. With ``--before DIR``, eager and fuseg run in pairs of processes, one importing fuseg from this
checkout and one from DIR, alternated (``--repeats`` pairs): after/before is the ratio of the
sides' median fuseg/eager (eager is the yardstick both share, so drift between processes
cancels). With ``--separate PAIRS``, Inductor and fuseg run in processes of their own (eager
first in each, the variant second), PAIRS of each, alternated: fuseg/Inductor is the ratio of
their median ratios to eager (Note [the variant made first]), and each first step is its
process's first compile, dynamo's first use included, as in a user's fresh process (the other
modes, in their first process, make Inductor first, so its first step pays that use and fuseg's does not);
``--floor`` adds as many processes of dynamo's ``aot_eager`` (its trace and AOTAutograd's, no
compiler), whose first step neither compiler's can be under. With ``--protocol``, each
variant's first step is followed by ``--window`` seconds of steps before the next variant is made,
and each row gets ``protocol`` (Note [the protocol] in perf/compiled.py: the first step, the
window's steps, the settled step; fuseg/eager and fuseg/Inductor of each; every ``--eager-every``-th step
of a compiled variant's window is an eager copy's, the window's ratios taken against those: Note
[eager at the same moments] there). The record names the CPU, its flags and the compiler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["TRAIN_MODELS", "main", "run_model", "separate", "timed_rounds"]

#: name: (transformers config class, model class, hidden, layers, tokens)
TRAIN_MODELS: dict[str, tuple[str, str, int, int, int]] = {
    "llama-tiny": ("LlamaConfig", "AutoModelForCausalLM", 64, 2, 32),
    "qwen2-tiny": ("Qwen2Config", "AutoModelForCausalLM", 64, 2, 32),
    "gpt2-tiny": ("GPT2Config", "AutoModelForCausalLM", 64, 2, 32),
    "phi3-tiny": ("Phi3Config", "AutoModelForCausalLM", 64, 2, 32),
    "bert-tiny": ("BertConfig", "AutoModelForMaskedLM", 64, 2, 32),
    "llama-256": ("LlamaConfig", "AutoModelForCausalLM", 256, 4, 128),
    "gpt2-256": ("GPT2Config", "AutoModelForCausalLM", 256, 4, 128),
    "bert-256": ("BertConfig", "AutoModelForMaskedLM", 256, 4, 128),
}
VOCAB = 128
BATCH = 2


def _model(name: str) -> tuple[Any, Any]:
    import torch
    import transformers

    config, kind, hidden, layers, tokens = TRAIN_MODELS[name]
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if config == "GPT2Config":
        cfg = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **common)
    elif config == "BertConfig":
        cfg = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                                      intermediate_size=4 * hidden, max_position_embeddings=256, **common)
    else:
        cfg = getattr(transformers, config)(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                            **common)
    # no dropout: the variants must compute the same step (dropout draws differ between backends)
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                "attention_dropout", "hidden_dropout", "resid_dropout", "embd_dropout"):
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)
    model = getattr(transformers, kind).from_config(cfg).train()
    ids = torch.randint(3, VOCAB, (BATCH, tokens), generator=torch.Generator().manual_seed(1))
    return model, ids


def run_model(name: str, rounds: int, steps: int, variants_wanted: list[str],
              window: float | None = None, eager_every: int = 5) -> dict[str, Any]:
    """In this process: compile, check against eager, then time every variant's steps. With
    ``window`` (seconds; Note [the protocol] in perf/compiled.py), each variant's first step is
    followed by steps back to back for that long before the next variant is made, and the row
    gets ``protocol``: the first step, the window's steps, the settled step; ``eager_every``: every
    that many steps of a compiled variant's window, one is an eager copy's (Note [eager at the same
    moments] in perf/compiled.py, whose EAGER_EVERY the default is: not imported at the top, as
    --before loads this file against older trees; 0: none)."""
    import copy
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from perf.compiled import compile_alone
    from runtime.dynamo import fuseg_backend

    if window is not None:
        from perf.compiled import protocol_record, timed_window
        from runtime.codegen.build import background_builds_under_way, wait_for_background_builds

    base, ids = _model(name)
    known = {"eager": None, "inductor": "inductor", "fuseg": fuseg_backend, "aot_eager": "aot_eager"}
    backends = {v: known[v] for v in variants_wanted}  # made (compiled, first step) in this order
    variants: dict[str, tuple[Any, Any, Any]] = {}
    first: dict[str, float] = {}
    windows: dict[str, list[float]] = {}
    references: dict[str, list[float]] = {}
    extra: dict[str, dict[str, Any]] = {}
    reference: list[Any] = []  # an eager copy of its own (its updates touch no variant's weights)
    for v, backend in backends.items():
        model = copy.deepcopy(base)
        # a backend per variant: dynamo would otherwise reuse one variant's graphs for another's copy
        # (and compiled as if alone in the process: Note [contestants compile alone] in perf/compiled.py)
        fn = model if backend is None else compile_alone(model, backend=backend)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        variants[v] = (model, fn, opt)
        start = {k: p.detach().clone() for k, p in model.named_parameters()}
        t0 = time.perf_counter()
        opt.zero_grad()
        fn(input_ids=ids, labels=ids).loss.backward()
        first[v] = time.perf_counter() - t0
        if window is not None:  # steps as a training loop makes them, right after the first
            if backend is not None and eager_every and not reference:
                ref = copy.deepcopy(base)
                reference.append((ref, torch.optim.SGD(ref.parameters(), lr=1e-3)))
            references[v] = []
            windows[v] = timed_window(lambda fn=fn, opt=opt: _step(fn, opt, ids), window,
                                      (lambda: _step(*reference[0], ids)) if backend is not None and eager_every else None,
                                      eager_every, references[v])
            if v == "fuseg":  # (its builds end before the next variant is made: they would slow it)
                extra[v] = {"builds_under_way_after_window": background_builds_under_way()}
                t1 = time.perf_counter()
                wait_for_background_builds()
                extra[v]["waited_for_builds_s"] = time.perf_counter() - t1
        with torch.no_grad():  # the first step's gradients stay; its update (and the window's) is undone
            for k, p in model.named_parameters():
                p.copy_(start[k])
    # one step of each from the same weights against eager's: the loss and every gradient
    check: dict[str, dict[str, float]] = {}
    losses, grads = {}, {}
    for v, (model, fn, opt) in variants.items():
        opt.zero_grad()
        loss = fn(input_ids=ids, labels=ids).loss
        loss.backward()
        losses[v] = float(loss)
        grads[v] = [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]
    for v in variants:
        if v == "eager":
            continue
        diffs = [float((a - b).abs().max()) for a, b in zip(grads[v], grads["eager"]) if a is not None and b is not None]
        scale = max(float(b.abs().max()) for b in grads["eager"] if b is not None)
        missing = sum((a is None) != (b is None) for a, b in zip(grads[v], grads["eager"]))
        check[v] = {"loss_diff": abs(losses[v] - losses["eager"]), "max_grad_diff": max(diffs, default=0.0),
                    "max_grad": scale, "gradients_missing_or_extra": missing}
    for _ in range(2):  # warm-up
        for _m, fn, opt in variants.values():
            opt.zero_grad()
            fn(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    times = timed_rounds(variants, ids, rounds, steps)
    ms = {v: 1e3 * statistics.median(t) for v, t in times.items()}
    row: dict[str, Any] = {"model": name, "order": list(variants), "shape": list(ids.shape), "step_ms": ms, "first_step_s": first,
                           "check_against_eager": check}
    if window is not None:
        row["protocol"] = protocol_record(window, list(variants), first, windows,
                                          {v: statistics.median(t) for v, t in times.items()}, extra, references,
                                          eager_every)
    if "fuseg" in ms:
        row["fuseg_over_eager"] = ms["fuseg"] / ms["eager"]
        row["fuseg_trials"] = _trials()
    if "inductor" in ms and "fuseg" in ms:
        row.update(fuseg_over_inductor=ms["fuseg"] / ms["inductor"], inductor_over_eager=ms["inductor"] / ms["eager"])
    return row


def _trials() -> list[dict[str, Any]]:
    """What each fuseg program's trial found (Note [a kernel tried in its program] and Note [a
    program against its ATen path] in runtime/compiled/trial.py), per size class for a symbolic plan."""
    import gc

    from runtime.compiled.program import CompiledProgram

    found = []
    for o in gc.get_objects():
        try:
            if type(o) is not CompiledProgram:
                continue
            result, under_way = getattr(o, "trial_result", None), getattr(o, "trial", None)  # (none before the trials)
            if result is not None or under_way is not None:
                found.append({"graph": o.graph.name, **(result or {"undecided": True})})
            if o.class_check is not None:  # (a symbolic plan: Note [a program's ATen path per size class])
                found.append({"graph": o.graph.name, "against": "its ATen path",
                              "classes": {str(b): r for b, r in o.class_check.results.items()}})
        except ReferenceError:  # (a dead weak proxy among the objects)
            continue
    return found


def _step(fn: Any, opt: Any, ids: Any) -> None:
    opt.zero_grad()
    fn(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def timed_rounds(variants: dict[str, tuple[Any, Any, Any]], ids: Any, rounds: int, steps: int,
                 after_round: Any = None) -> dict[str, list[float]]:
    """Each variant's (model, compiled, optimizer) steps on ``ids``: ``rounds`` blocks of
    ``steps`` each, the variants' order reversed every other round; the seconds of each step.
    ``after_round(r, times)``, where given, runs after each round (it may clear what was timed)."""
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for v in order:
            _m, fn, opt = variants[v]
            for _ in range(steps):
                t0 = time.perf_counter()
                _step(fn, opt, ids)
                times[v].append(time.perf_counter() - t0)
        if after_round is not None:
            after_round(r, times)
    return times


_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(name: str, rounds: int, steps: int, variants: list[str], tree: str = _HERE,
           window: float | None = None, eager_every: int = 5) -> dict[str, Any]:
    """``run_model`` in a fresh process with empty caches, importing fuseg from ``tree`` (this
    checkout, or ``--before``'s); this file is loaded by its path, so an older tree runs the same
    models and protocol."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), PYTHONWARNINGS="ignore")
        env.pop("PYTHONPATH", None)
        code = ("import importlib.util, json, sys; sys.path.insert(0, sys.argv[1]);"
                "spec = importlib.util.spec_from_file_location('fuseg_train_step', sys.argv[2]);"
                "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod);"
                "w = float(sys.argv[7]) if len(sys.argv) > 7 else None;"
                "kw = {'eager_every': int(sys.argv[8])} if len(sys.argv) > 8 else {};"
                "print(json.dumps(mod.run_model(sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6].split(','), w,"
                " **kw)))")
        cmd = [sys.executable, "-c", code, tree, os.path.abspath(__file__), name, str(rounds), str(steps),
               ",".join(variants), *([str(window), str(eager_every)] if window is not None else [])]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, cwd=tmp)
        if done.returncode != 0:
            return {"model": name, "tree": tree, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["tree"] = tree
        return row


def _processes(name: str, rounds: int, steps: int, processes: int, window: float | None = None,
               eager_every: int = 5) -> dict[str, Any]:
    """``_child`` in ``processes`` fresh processes, one after another: with more than one, the
    row holds each (``processes``), each variant's median step over them and the median of their
    ratios (the step of a tiny model moved by a third between processes doing the same work:
    Inductor's llama-tiny step took 1.64 ms in one and 2.61-2.62 in two others, 2026-11-27)."""
    # Inductor and fuseg swap places from one process to the next (the one made first ran slower
    # in an A/A trial: perf.experiments.embedding_backward); eager, the yardstick, always first
    orders = (["eager", "inductor", "fuseg"], ["eager", "fuseg", "inductor"])
    runs = [_child(name, rounds, steps, orders[j % 2], window=window, eager_every=eager_every) if window is not None
            else _child(name, rounds, steps, orders[j % 2]) for j in range(processes)]
    ok = [r for r in runs if "error" not in r]
    if processes == 1 or len(ok) < len(runs):
        return runs[0] if processes == 1 else next(r for r in runs if "error" in r)
    ms = {v: statistics.median(r["step_ms"][v] for r in ok) for v in ok[0]["step_ms"]}
    worst = max(ok, key=lambda r: r["check_against_eager"]["fuseg"]["max_grad_diff"])
    merged = {"protocol": _median_tree([r["protocol"] for r in ok])} if "protocol" in ok[0] else {}
    return {"model": name, "shape": ok[0]["shape"], "step_ms": ms, **merged,
            "first_step_s": {v: statistics.median(r["first_step_s"][v] for r in ok) for v in ok[0]["first_step_s"]},
            "check_against_eager": worst["check_against_eager"],
            "fuseg_over_eager": statistics.median(r["fuseg_over_eager"] for r in ok),
            "fuseg_over_inductor": statistics.median(r["fuseg_over_inductor"] for r in ok),
            "inductor_over_eager": statistics.median(r["inductor_over_eager"] for r in ok),
            "fuseg_over_inductor_per_process": [r["fuseg_over_inductor"] for r in ok], "processes": ok}


def _median_tree(trees: list[Any]) -> Any:
    """The processes' protocols as one: every number the median of theirs, anything else the
    first process's (the order alternates: each process's own is in ``processes``)."""
    if all(isinstance(t, dict) for t in trees):
        return {k: _median_tree([t[k] for t in trees]) for k in trees[0] if all(k in t for t in trees)}
    if all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in trees):
        return statistics.median(trees)
    return trees[0]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r and "fuseg_over_inductor" in r]
    if not ok:
        return {}
    with_protocol = [r for r in ok if "protocol" in r]
    if with_protocol:
        from perf.compiled import protocol_summary
    return {
        **({"protocol": protocol_summary(with_protocol)} if with_protocol else {}),
        "median_fuseg_over_inductor": statistics.median(r["fuseg_over_inductor"] for r in ok),
        "median_fuseg_over_eager": statistics.median(r["fuseg_over_eager"] for r in ok),
        "slower_than_inductor": {r["model"]: round(r["fuseg_over_inductor"], 3) for r in ok
                                 if r["fuseg_over_inductor"] > 1.0},
        "max_grad_diff": max(r["check_against_eager"]["fuseg"]["max_grad_diff"] for r in ok),
    }


def separate(name: str, rounds: int, steps: int, pairs: int, floor: bool = False) -> dict[str, Any]:
    """Inductor and fuseg each in ``pairs`` processes of their own, alternated (which goes first
    swaps from pair to pair), eager first in every one: each is the second variant made in its
    process, so neither gains from the order (Note [the variant made first]); fuseg/Inductor is
    the ratio of their median ratios to eager (the yardstick every process has). ``floor``: as
    many processes of dynamo's ``aot_eager`` (its trace and AOTAutograd's, no compiler), whose
    first step is what neither compiler's can be under."""
    names = ("inductor", "fuseg", *(("aot_eager",) if floor else ()))
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
    for k in range(pairs):
        for v in (names if k % 2 == 0 else names[::-1]):
            runs[v].append(_child(name, rounds, steps, ["eager", v]))
    failed = [r for rs in runs.values() for r in rs if "error" in r]
    if failed:
        return failed[0]
    med = {v: statistics.median(r["step_ms"][v] / r["step_ms"]["eager"] for r in rs) for v, rs in runs.items()}
    # each first step the first compile of its process (eager's steps use no compiler): what a
    # user's fresh process pays, dynamo's first use included for both
    first = {v: statistics.median(r["first_step_s"][v] for r in rs) for v, rs in runs.items()}
    worst = max(runs["fuseg"], key=lambda r: r["check_against_eager"]["fuseg"]["max_grad_diff"])
    row = {"model": name, "separate": True, "check_against_eager": worst["check_against_eager"],
           "fuseg_over_eager": med["fuseg"], "inductor_over_eager": med["inductor"],
           "fuseg_over_inductor": med["fuseg"] / med["inductor"], "first_step_s": first,
           "first_step_fuseg_over_inductor": first["fuseg"] / first["inductor"]}
    if floor:
        row.update(aot_eager_over_eager=med["aot_eager"],
                   first_step_floor_over_inductor=first["aot_eager"] / first["inductor"])
    return {**row, "runs": runs}


# Note [the variant made first]: in one process, two identical fuseg variants of a model
# differed by 3-6% in their training step with the order they were made in (compiled, first
# step), the one made first the slower (an A/A trial, perf.experiments.embedding_backward);
# with Inductor and fuseg, fuseg's ratio moved by 4-10% between the two orders. The cause was
# not found. ``_processes`` swaps the order from one process to the next; ``separate`` puts each
# compiled variant in processes of its own, second after eager in every one.


def before_after(name: str, before: str, rounds: int, steps: int, repeats: int) -> dict[str, Any]:
    """fuseg/eager of this checkout against ``before``'s: ``repeats`` pairs of processes, the
    sides alternating; after/before is the ratio of the sides' medians (eager the yardstick)."""
    runs: dict[str, list[dict[str, Any]]] = {"after": [], "before": []}
    for k in range(repeats):
        for side in (("after", "before") if k % 2 == 0 else ("before", "after")):
            runs[side].append(_child(name, rounds, steps, ["eager", "fuseg"], _HERE if side == "after" else before))
    bad = [r["error"] for rs in runs.values() for r in rs if "error" in r]
    if bad:
        return {"model": name, "error": bad[0], "runs": runs}
    med = {side: statistics.median(r["fuseg_over_eager"] for r in rs) for side, rs in runs.items()}
    return {"model": name, "fuseg_over_eager": med, "after_over_before": med["after"] / med["before"], "runs": runs}


def main(argv: list[str] | None = None) -> int:
    from perf.bench import environment

    p = argparse.ArgumentParser(prog="python -m perf.train_step", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help=f"default: all of {', '.join(TRAIN_MODELS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per variant in each round")
    p.add_argument("--before", help="another checkout of this project: fuseg/eager there against here")
    p.add_argument("--repeats", type=int, default=2, help="with --before: process pairs per model")
    p.add_argument("--processes", type=int, default=1,
                   help="fresh processes per model (the row: each variant's median step over them, and the "
                        "median of their fuseg/Inductor ratios)")
    p.add_argument("--separate", type=int, default=0, metavar="PAIRS",
                   help="Inductor and fuseg in processes of their own, PAIRS of each, eager the yardstick in every one")
    p.add_argument("--floor", action="store_true",
                   help="with --separate: as many processes of dynamo's aot_eager (trace and AOTAutograd, no "
                        "compiler), whose first step neither compiler's can be under")
    p.add_argument("--protocol", action="store_true",
                   help="each variant's first step, the --window of steps after it, the settled step "
                        "(Note [the protocol] in perf/compiled.py)")
    p.add_argument("--window", type=float, default=30.0, help="with --protocol: seconds of steps after each first step")
    p.add_argument("--eager-every", type=int, default=5,
                   help="with --protocol: every N-th step of a compiled variant's window is an eager copy's, the "
                        "window's ratios taken against those (Note [eager at the same moments] in perf/compiled.py; "
                        "default 5, 0: none)")
    p.add_argument("--out", help="write the record (JSON) here")
    args = p.parse_args(argv)
    if args.floor and not args.separate:
        p.error("--floor: only with --separate")
    if args.protocol and (args.before or args.separate):
        p.error("--protocol: not with --before or --separate")
    if args.window <= 0:
        p.error("--window must be positive")
    if args.eager_every < 0 or args.eager_every == 1:
        p.error("--eager-every: 0 (none) or at least 2 (a step of the variant's own between two of eager's)")
    window = args.window if args.protocol else None
    unknown = [m for m in args.models if m not in TRAIN_MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(TRAIN_MODELS)}")
    before = os.path.abspath(args.before) if args.before else None
    if before and not os.path.isfile(os.path.join(before, "runtime", "dynamo.py")):
        p.error(f"--before {args.before}: no runtime/dynamo.py there")
    names = args.models or list(TRAIN_MODELS)
    rows = []
    for k, name in enumerate(names):
        print(f"[{k + 1}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        if before:
            row = before_after(name, before, args.rounds, args.steps, args.repeats)
            rows.append(row)
            if "error" not in row:
                f = row["fuseg_over_eager"]
                print(f"  {name}: fuseg/eager after {f['after']:.3f}, before {f['before']:.3f}: "
                      f"after/before {row['after_over_before']:.3f}", flush=True)
        elif args.separate:
            row = separate(name, args.rounds, args.steps, args.separate, args.floor)
            rows.append(row)
            if "error" not in row:
                print(f"  {name}: fuseg/eager {row['fuseg_over_eager']:.3f}, Inductor/eager {row['inductor_over_eager']:.3f}:"
                      f" fuseg/Inductor {row['fuseg_over_inductor']:.3f}; first step (each the first compile of its"
                      f" process) fuseg {row['first_step_s']['fuseg']:.1f} s, Inductor {row['first_step_s']['inductor']:.1f}"
                      f" s: {row['first_step_fuseg_over_inductor']:.3f}"
                      + (f"; aot_eager {row['first_step_s']['aot_eager']:.1f} s" if args.floor else ""), flush=True)
        else:
            row = _processes(name, args.rounds, args.steps, args.processes, window, args.eager_every)
            rows.append(row)
            if "error" not in row:
                ms, c = row["step_ms"], row["check_against_eager"]["fuseg"]
                print(f"  {name}: step eager {ms['eager']:.2f} ms, Inductor {ms['inductor']:.2f}, fuseg {ms['fuseg']:.2f}"
                      f" (fuseg/Inductor {row['fuseg_over_inductor']:.2f}, fuseg/eager {row['fuseg_over_eager']:.2f});"
                      f" first step fuseg {row['first_step_s']['fuseg']:.1f} s, Inductor "
                      f"{row['first_step_s']['inductor']:.1f} s; grad diff {c['max_grad_diff']:.1e}", flush=True)
                if "protocol" in row:
                    print("  " + "; ".join(f"fuseg/{t}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                       row["protocol"].get(f"fuseg_vs_{t}", {}).items())
                                           for t in ("eager", "inductor")), flush=True)
        if "error" in row:
            print(f"  {name}: failed: {row['error']}", flush=True)
    record = {"environment": environment("cpu"), "method": __doc__, "command": " ".join(["python -m perf.train_step", *(argv if argv is not None else sys.argv[1:])]),
              "rounds": args.rounds, "steps": args.steps, "processes": args.processes, "separate": args.separate,
              **({"protocol_window_s": window, "eager_every": args.eager_every} if window is not None else {}),
              "before": before, "results": rows}
    if before:
        ok = [r for r in rows if "error" not in r]
        record["summary"] = {"after_over_before": {r["model"]: r["after_over_before"] for r in ok}}
    else:
        record["summary"] = summary(rows)
    print(json.dumps(record["summary"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
