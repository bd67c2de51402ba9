"""Note [kernels side by side] (runtime/compiled/chains.py): which steps of a chain run at once, that a
group computes exactly what its kernels compute one by one (values, strides, inputs written,
arena bytes), and the trial between the two ways on the chain's first calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime.codegen import thresholds
from runtime.codegen.build import cpu_compiler
from runtime.codegen.kernel import BESIDE_MARK, Kernel, Param, beside
from runtime.codegen.runner import GROUP_MAX
from runtime.compiled import chains
from runtime.compiled.trial import CALLS
from segmenter import SegmenterOptions, capture, segment

from .util import assert_matches_eager

needs_compiler = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


def _param(value: str, output: bool = False) -> Param:
    return Param(f"{value}_", value, torch.float32, (4,), (1,), output)


def _step(reads: str, writes: str, kind: str = "pointwise", body: str = "  y_[0] = x_[0];\n",
          returns: str = "void", beside: bool = False) -> SimpleNamespace:
    params = tuple(_param(v) for v in reads.split()) + tuple(_param(v, True) for v in writes.split())
    macs = 1 << 22 if kind == "matmul" else None  # (a kernel that calls the matmul routines)
    return SimpleNamespace(kernel=Kernel("k", params, body, 1, 1, kind, returns=returns, beside=beside,
                                         parallel_macs=macs))


_THREADED = "#pragma omp parallel for schedule(static)\n  for (long i = 0; i < 4; ++i) y_[i] = x_[i];\n"

# (name, steps, groups: first step -> size)
GROUPS = [
    ("independent: one group", [_step("a", "b"), _step("c", "d")], {0: 2}),
    ("the second reads what the first writes", [_step("a", "b"), _step("b", "c")], {}),
    ("the second writes what the first reads", [_step("a", "b"), _step("c", "a")], {}),
    ("both write one value", [_step("a", "b"), _step("c", "b")], {}),
    ("both read one input: a group", [_step("a", "b"), _step("a", "c")], {0: 2}),
    ("a dependent third starts anew", [_step("a", "b"), _step("c", "d"), _step("b", "e"), _step("f", "g")],
     {0: 2, 2: 2}),
    ("a third that reads the first's output ends the group",
     [_step("a", "b"), _step("c", "d"), _step("d", "e")], {0: 2}),
    ("a kernel with a parallel loop runs alone", [_step("a", "b"), _step("c", "d", body=_THREADED)], {}),
    ("a count stops the chain: alone", [_step("a", "b"), _step("c", "d", returns="long long")], {}),
    ("symbolic sizes: alone", [_step("a", "b"), _step("c", "d", body="  y_[0] = x_[fuseg_s0];\n")], {}),
    ("a matmul whose routine may share its loops: alone", [_step("a", "b"), _step("c", "d", kind="matmul")], {}),
    ("a matmul its generator says stays on one thread",
     [_step("a", "b"), _step("c", "d", kind="matmul", beside=True)], {0: 2}),
    ("a loop whose threads are for when it runs alone",
     [_step("a", "b"), _step("c", "d", body=_THREADED.replace("(static)", "(static)" + BESIDE_MARK))], {0: 2}),
    (f"at most {GROUP_MAX} a group", [_step(f"x{i}", f"y{i}") for i in range(GROUP_MAX + 3)], {0: GROUP_MAX, GROUP_MAX: 3}),
]


@pytest.mark.parametrize("name, steps, groups", GROUPS, ids=[g[0] for g in GROUPS])
def test_groups(name, steps, groups) -> None:
    assert chains._groups(steps, lambda v: (v, 0)) == groups


def test_views_of_one_buffer_are_one_value() -> None:
    """Two kernels writing different views of one buffer share its root: never a group."""
    roots = {"b1": ("buf", 0), "b2": ("buf", 64)}
    steps = [_step("a", "b1"), _step("c", "b2")]
    assert chains._groups(steps, lambda v: roots.get(v, (v, 0))) == {}


def test_a_matmul_knows_when_its_routine_stays_on_one_thread() -> None:
    small = _compiled(_two_products, _two_products_inputs(8))[1]
    big_n = int((thresholds.current().macs // 64) ** 0.5) + 8  # n x 64 @ 64 x n: past the threshold
    big = _compiled(_two_products, [torch.randn(big_n, 64), torch.randn(64, big_n)] * 2 + [torch.randn(big_n, big_n)])[1]
    kinds = lambda p: [(k.kind, beside(k)) for k in p.kernels.values() if k.kind == "matmul"]  # noqa: E731
    assert kinds(small) == [("matmul", True)] * 2
    assert kinds(big) == [("matmul", False)] * 2


def _compiled(fn, inputs, chains_=True, **options):
    plan = apply_aliases(segment(capture(fn, inputs), SegmenterOptions(**options)), "post")
    return plan, runtime.compile_program(plan, backend="cpp", chains=chains_)


def _two_products(a, b, c, d, e):
    return (a @ b).relu() + 1.0, (c @ d) * 2.0 + e


def _two_products_inputs(n):
    return [torch.randn(n, 16), torch.randn(16, n), torch.randn(n, 16), torch.randn(16, n), torch.randn(n, n)]


def _dead_before_the_group(x, w, c, d):
    t = x.sin()  # read only by the first product: dead within the group
    return (t @ w).cos(), (c @ d).exp()


def _writes_its_input(x, w, c, d):
    x.mul_(2)
    return (x @ w).cos(), (c @ d).sin()


def _linear_backward(g, x, w):
    # what a linear layer's backward computes: the input's and the weight's gradients, the bias's
    return (g @ w).tanh(), (g.t() @ x).exp(), g.sum(0)


def _chain_of_dependent(x, w):
    return ((x @ w).sin() @ w).cos()


def _sq(n):
    return lambda: [torch.randn(n, n) for _ in range(4)]


# (name, program, inputs at two sizes, segmenter options, groups per chain)
PROGRAMS = [
    ("two products", _two_products, _two_products_inputs, {}, [[2]]),
    ("a value that dies in the group", _dead_before_the_group, lambda n: _sq(n)(), {"max_ops_per_segment": 1}, [[2]]),
    ("an input written in place", _writes_its_input, lambda n: _sq(n)(), {}, [[2]]),
    ("a linear layer's gradients", _linear_backward, lambda n: [torch.randn(n, 2 * n), torch.randn(n, 8), torch.randn(2 * n, 8)],
     {}, [[2, 2]]),
    ("each product reads the last: no group", _chain_of_dependent, lambda n: _sq(n)()[:2], {}, [[]]),
]


@needs_compiler
@pytest.mark.parametrize("name, fn, make, options, groups", PROGRAMS, ids=[p[0] for p in PROGRAMS])
@pytest.mark.parametrize("n", [8, 24])
def test_groups_compute_what_one_by_one_computes(name, fn, make, options, groups, n) -> None:
    inputs = make(n)
    plan, program = _compiled(fn, inputs, **options)
    assert [c.groups for c in program.chains] == groups, program.source
    _, alone = _compiled(fn, inputs, chains_=False, **options)
    # every call of the trial (either way) and after it: eager's values, strides, inputs written
    for _ in range(2 + 2 * CALLS + 2):
        assert_matches_eager(fn, make(n), plan.graph, program=program)
    a, b = program(*[t.clone() for t in inputs]), alone(*[t.clone() for t in inputs])
    for x, y in zip(a, b):
        assert torch.equal(x, y) and x.stride() == y.stride()
    for c in program.chains:
        assert (c.ways is None) == (not c.groups)
        if c.ways is not None:
            assert c.ways.chosen in ("groups", "plain")
            assert [len(t) for t in c.ways.times.values()] == [CALLS, CALLS]


def _read_in_a_group_then_dead(x, c):
    t = x.sin()
    u = t.cos()  # the last read of t
    v = c.exp()  # beside it: written while t is read
    return u * v


@needs_compiler
@pytest.mark.parametrize("n", [8, 24])
def test_a_value_read_in_a_group_and_one_written_there_get_their_own_bytes(n) -> None:
    """One by one, the sine (last read by the cosine) and the exponential (written after it)
    share bytes; run at once they may not."""
    inputs = _sq(n)()[:2]
    plan, program = _compiled(_read_in_a_group_then_dead, inputs, max_ops_per_segment=1)
    (chain,) = program.chains
    assert chain.groups == [2]
    assert chain.arena["sin"] != chain.arena["exp"]
    for _ in range(2 + 2 * CALLS):
        assert_matches_eager(_read_in_a_group_then_dead, _sq(n)()[:2], plan.graph, program=program)
    # one by one (no group: the steps depend on each other), the two share bytes
    plan, program = _compiled(lambda x, c: x.sin().cos().exp() * c, inputs, max_ops_per_segment=1)
    assert program.chains[0].groups == [] and program.chains[0].arena["sin"] == program.chains[0].arena["exp"]


@needs_compiler
@pytest.mark.parametrize("n", [8, 24])
def test_one_thread_runs_a_group_one_by_one(n) -> None:
    inputs = _two_products_inputs(n)
    plan, program = _compiled(_two_products, inputs)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for _ in range(2 + 2 * CALLS):
            assert_matches_eager(_two_products, _two_products_inputs(n), plan.graph, program=program)
    finally:
        torch.set_num_threads(threads)


@needs_compiler
@pytest.mark.parametrize("faster", ["groups", "plain"])
def test_the_trial_keeps_the_faster_way(faster, monkeypatch) -> None:
    """The way whose calls take less keeps the chain (a clock the test drives: no test depends on
    a timing); the first call each way is not timed; the chosen way runs from then on."""
    inputs = _two_products_inputs(8)
    _, program = _compiled(_two_products, inputs)
    (chain,) = program.chains
    ways = chain.ways
    clock = [0.0]
    run, address = ways.run, dict(ways.address)
    ran = []

    def timed_run(code: int, slots: int) -> int:
        way = next(w for w, a in address.items() if a == code)
        ran.append(way)
        clock[0] += 1e-6 if way == faster else 2e-6
        return run(code, slots)

    monkeypatch.setattr(ways, "run", timed_run)
    monkeypatch.setattr(chains.time, "perf_counter", lambda: clock[0])
    for _ in range(2 + 2 * CALLS):
        program(*inputs)
    assert ways.chosen == faster
    assert ran.count("groups") == ran.count("plain") == 1 + CALLS
    assert ran[:4] == ["groups", "plain", "plain", "groups"]  # pairs alternate which way goes first
    ran.clear()
    program(*inputs)
    assert ran == [faster]


@needs_compiler
def test_calls_while_builds_hold_cores_are_not_timed(monkeypatch) -> None:
    inputs = _two_products_inputs(8)
    _, program = _compiled(_two_products, inputs)
    (chain,) = program.chains
    monkeypatch.setattr(chains.threads, "busy", lambda: True)
    for _ in range(2 + 2 * CALLS):
        program(*inputs)
    assert chain.ways.chosen is None and chain.ways.times == {"groups": [], "plain": []}


@needs_compiler
def test_training_through_torch_compile_with_groups() -> None:
    """A linear layer's backward (its three gradients) through torch.compile, at two batch sizes,
    against eager's gradients at every step."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="fuseg", dynamic=False)
    for rows in (12, 12, 20, 20) + (12,) * (2 * CALLS):
        x = torch.randn(rows, 16)
        loss = F.mse_loss(compiled(x), torch.ones(rows, 8))
        loss.backward()
        ref = F.mse_loss(reference(x), torch.ones(rows, 8))
        ref.backward()
        torch.testing.assert_close(loss, ref)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None


@needs_compiler
def test_a_drift_from_the_trial_tries_both_ways_again(monkeypatch) -> None:
    """The chosen way's calls stay timed: ``CALLS`` in a row more than DRIFT times off its trial's
    median start the trial again (the machine's load changed), which may choose the other way;
    fewer in a row do not."""
    inputs = _two_products_inputs(8)
    plan, program = _compiled(_two_products, inputs)
    (chain,) = program.chains
    ways = chain.ways
    clock, cost = [0.0], {"groups": 1e-6, "plain": 2e-6}
    run, address = ways.run, dict(ways.address)

    def timed_run(code: int, slots: int) -> int:
        clock[0] += cost[next(w for w, a in address.items() if a == code)]
        return run(code, slots)

    monkeypatch.setattr(ways, "run", timed_run)
    monkeypatch.setattr(chains.time, "perf_counter", lambda: clock[0])
    for _ in range(2 + 2 * CALLS):
        program(*inputs)
    assert ways.chosen == "groups" and ways.baseline == pytest.approx(1e-6) and ways.trials == 1
    cost["groups"] = 1e-6 * (chains.DRIFT + 1)  # the load changed: groups now wait for their threads
    for _ in range(CALLS - 1):
        program(*inputs)
    cost["groups"] = 1e-6
    program(*inputs)  # one call back at the baseline: the run of drifted calls starts over
    assert ways.chosen == "groups" and ways.drifted == 0
    cost["groups"] = 1e-6 * (chains.DRIFT + 1)
    for _ in range(CALLS):
        program(*inputs)
    assert ways.chosen is None  # tried again
    for _ in range(2 + 2 * CALLS):  # (every call of the new trial computes eager's values)
        assert_matches_eager(_two_products, _two_products_inputs(8), plan.graph, program=program)
    assert ways.chosen == "plain" and ways.baseline == pytest.approx(2e-6) and ways.trials == 2


@needs_compiler
@pytest.mark.parametrize("n", [8, 24])
def test_a_kernel_of_empty_outputs_last_in_a_chain(n) -> None:
    """Found by the fuzzer: a kernel whose outputs are all empty runs no step, yet its values
    are placed in the arena, after the chain's last step."""
    def fn(x, w, e):
        return ((x @ w).sin() + 1).exp(), (e.cos() * 2).tanh()

    make = lambda: [torch.randn(n, n), torch.randn(n, n), torch.randn(0, n)]  # noqa: E731
    plan, program = _compiled(fn, make(), max_ops_per_segment=1)
    assert program.chains
    for _ in range(2 + 2 * CALLS):
        assert_matches_eager(fn, make(), plan.graph, program=program)
