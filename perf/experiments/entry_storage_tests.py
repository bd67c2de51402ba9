"""The storage tests of a program's entry (``CompiledProgram._storage_tests``), each storage
fetched once against fetched per test, timed on the same inputs in one process.

    python -m perf.experiments.entry_storage_tests [--model gpt2-tiny] [--rounds 15] [--out FILE]

A training step's backward program (the model's last fuseg program, through ``perf.train_step``'s
model and ``torch.compile``) is called once in a step to record its inputs. Its storage tests
(offsets, storage sizes, which inputs share a storage) are generated as the entry has them, and
again with every storage fetched where it is read (``untyped_storage()`` per test: how the tests
of inputs that share storages were written before 2026-11-28). Both are compiled into functions
of the same inputs and timed alternately (``timeit``, best of 3 of 2000 calls, the median over
the rounds). Both must pass on these inputs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import timeit
from typing import Any


def run(model: str, rounds: int) -> dict[str, Any]:
    import copy
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from perf.train_step import _model
    from runtime.dynamo import FusegCompiler, compile_with_aot
    from runtime.emit.wrapper import Code

    base, ids = _model(model)
    compiler, m = FusegCompiler(), copy.deepcopy(base)
    fn = torch.compile(m, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    fn(input_ids=ids, labels=ids).loss.backward()
    prog = compiler.compiled[-1]
    seen: list[tuple] = []
    entry = prog.entry
    prog.entry = lambda *a: (seen.append(a), entry(*a))[1]
    m.zero_grad()
    fn(input_ids=ids, labels=ids).loss.backward()
    prog.entry = entry
    (inputs,) = seen[-1:]
    params = [f"v{i}" for i in range(len(inputs))]
    code = Code(sizes=prog.sizes)
    once = " and ".join(prog._storage_tests(code, params))
    each = re.sub(r"\(_s(\d+) := (v\d+\.untyped_storage\(\))\)", r"\2", once)
    each = re.sub(r"_s(\d+)\._cdata", r"v\1.untyped_storage()._cdata", each)
    env = dict(getattr(code, "constants", {}))
    f_once = eval(f"lambda {', '.join(params)}: {once}", env)  # noqa: S307 - our own generated source
    f_each = eval(f"lambda {', '.join(params)}: {each}", env)  # noqa: S307
    assert f_once(*inputs) and f_each(*inputs), "the tests refuse the program's own inputs"
    times: dict[str, list[float]] = {"fetched_per_test": [], "fetched_once": []}
    for _ in range(rounds):
        for k, f in (("fetched_per_test", f_each), ("fetched_once", f_once)):
            times[k].append(min(timeit.repeat(lambda f=f: f(*inputs), number=2000, repeat=3)) / 2000 * 1e6)
    us = {k: statistics.median(v) for k, v in times.items()}
    return {"model": model, "graph": prog.graph.name, "inputs": len(inputs),
            "storage_fetches": {"fetched_per_test": each.count("untyped_storage()"),
                                "fetched_once": once.count("untyped_storage()")},
            "us": us, "once_over_per_test": us["fetched_once"] / us["fetched_per_test"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out")
    args = p.parse_args()
    from perf.bench import environment, write_record

    row = run(args.model, args.rounds)
    record = {"environment": environment("cpu"), "method": __doc__,
              "command": f"python -m perf.experiments.entry_storage_tests --model {args.model} --rounds {args.rounds}",
              "results": [row]}
    write_record(record, args.out)


if __name__ == "__main__":
    main()
