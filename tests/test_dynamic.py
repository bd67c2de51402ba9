"""Dynamic shapes through ``torch.compile(backend="fuseg")`` (issue 41): graphs that dynamo and
AOTAutograd hand over with symbolic sizes, SymInt inputs and SymInt outputs, each program run on
two or more shapes against eager."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _returns_a_size(x):
    return x + 1, x.size(0) * 2


def test_a_graph_that_returns_a_size() -> None:
    """Under dynamic=True the graph returns ``x.size(0) * 2`` as a SymInt output (Mistral's
    generate failed so: 'graph outputs must be tensors')."""
    fn = torch.compile(_returns_a_size, backend="fuseg", dynamic=True)
    for n in (3, 5, 6):
        x = torch.randn(n, 4)
        got, expected = fn(x), _returns_a_size(x)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1] and type(got[1]) is int


def _tiny_llama() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=100, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def test_training_on_several_sequence_lengths() -> None:
    """What a data loader with dynamic padding does: the forward graph returns SymInts saved for
    the backward, which takes them as inputs (the second length crashed: 'int' object has no
    attribute 'as_strided'). Loss and every gradient match eager at each length."""
    model = _tiny_llama()
    ours = copy.deepcopy(model)
    compiled = torch.compile(ours, backend="fuseg")
    for length in (8, 12, 16):
        ids = torch.randint(0, 100, (2, length))
        model.zero_grad()
        ours.zero_grad()
        expected = model(input_ids=ids, labels=ids).loss
        got = compiled(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        expected.backward()
        got.backward()
        for (name, a), b in zip(model.named_parameters(), ours.parameters()):
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=f"length {length}: {name}")


# -- one symbolic plan for every size (Note [symbolic plans] in segmenter/ir/symbolic.py) ---------

def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _halves(x):
    h = x.shape[1] // 2
    return x[:, :h] * 2 + x[:, h:2 * h]


def _causal(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _masked_scores(s):
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(-1)


def _mutates(x, y):
    x.mul_(2)
    return x + y


def _views(x):
    return x.t(), x[1:], x.sum(0)


def _embed(ids, table):
    return torch.nn.functional.embedding(ids, table) * 2


def _expand(x):
    return x[:, None, :].expand(-1, 3, -1) + 1


#: name -> (function, inputs at size n)
DYNAMIC_PROGRAMS = {
    "softmax-view-sum": (lambda x, y: ((z := (x * 2).softmax(-1) + y).view(-1), z.sum(0)),
                         lambda n: [torch.randn(n, 8), torch.randn(8)]),
    "rms-norm": (_rms, lambda n: [torch.randn(2, n, 16), torch.randn(16)]),
    "layer-norm": (lambda x, w, b: torch.nn.functional.layer_norm(x, (16,), w, b),
                   lambda n: [torch.randn(n, 16), torch.randn(16), torch.randn(16)]),
    "halves": (_halves, lambda n: [torch.randn(3, 2 * n)]),
    "cat": (lambda x, y: torch.cat([x, y], 0).relu(), lambda n: [torch.randn(n, 4), torch.randn(5, 4)]),
    "matmul": (lambda x, w: (x.reshape(-1, 8) @ w).view(x.shape[0], x.shape[1], 4),
               lambda n: [torch.randn(2, n, 8), torch.randn(8, 4)]),
    "bmm-transposed": (lambda a, b: a @ b.transpose(1, 2), lambda n: [torch.randn(2, n, 8), torch.randn(2, n, 8)]),
    "causal-attention": (_causal, lambda n: [torch.randn(1, 2, n, 8) for _ in range(3)]),
    "masked-softmax": (_masked_scores, lambda n: [torch.randn(2, n, n)]),
    "embedding": (_embed, lambda n: [torch.randint(0, 10, (1, n)), torch.randn(10, 8)]),
    "expand": (_expand, lambda n: [torch.randn(n, 5)]),
    "mean-over-dynamic": (lambda x: x.mean(0) + x.amax(0), lambda n: [torch.randn(n, 6)]),
    "transpose-contiguous": (lambda x: x.transpose(0, 1).contiguous() * 3, lambda n: [torch.randn(n, 7)]),
    "mutates-input": (_mutates, lambda n: [torch.randn(n, 4), torch.randn(n, 4)]),
    "views-of-input": (_views, lambda n: [torch.randn(n, 3)]),
}


def _run_dynamic(fn, make, sizes, tol=None):
    """``fn`` compiled with dynamic shapes and run on each size against eager (values, strides,
    aliasing, inputs afterwards); outputs within ``tol`` where given (else the fuzzers' 1e-4)."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    for n in sizes:
        check_size(compiled, fn, make, n, tol)
    return compiler


def check_size(compiled, fn, make, n: int, tol=None) -> None:
    """``compiled`` against ``fn`` on ``make(n)``: values, strides, aliasing, inputs afterwards."""
    from segmenter.capturing.reference import clone_inputs

    from .test_fuzz_dynamo import _close, _tensors
    from .util import alias_pattern, layout

    torch.manual_seed(n)
    inputs = make(n)
    want_in, got_in = clone_inputs(inputs), clone_inputs(inputs)
    with torch.no_grad():
        want, got = fn(*want_in), compiled(*got_in)
    w_out, g_out = _tensors(want), _tensors(got)
    assert len(w_out) == len(g_out)
    for j, (e, g) in enumerate(zip(w_out, g_out)):
        assert layout(g) == layout(e), f"size {n} output {j}"
        assert _close(g, e), f"size {n} output {j}: values"
        if tol is not None:
            torch.testing.assert_close(g, e, atol=tol, rtol=tol, msg=f"size {n} output {j}")
    assert alias_pattern(want_in, w_out) == alias_pattern(got_in, g_out), f"size {n}: aliasing"
    for i, (e, g) in enumerate(zip(want_in, got_in)):
        assert _close(g, e), f"size {n}: input {i} afterwards"


@pytest.mark.parametrize("name", sorted(DYNAMIC_PROGRAMS))
def test_one_plan_serves_every_size(name: str) -> None:
    """Each program on three sizes against eager (values, strides, aliasing, mutated inputs);
    dynamo hands over one graph with symbolic sizes, and one symbolic plan runs every call."""
    fn, make = DYNAMIC_PROGRAMS[name]
    compiler = _run_dynamic(fn, make, (9, 11, 13))  # (no size equal to another dim: dynamo would tie them)
    assert compiler.symbolic_refused == []
    assert len(compiler.compiled) == 1, [p.graph.inputs for p in compiler.compiled]
    (program,) = compiler.compiled
    assert program.sizes is not None and program.sizes.sources, "the plan has symbolic sizes"


# -- matmul and attention kernels of symbolic sizes (Note [kernel sizes as arguments]) ----------

def _sdpa_mask(q, k, v, m):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)


def _sdpa_decode(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


#: name -> (function, inputs at size n, the kind of kernel that must take the symbolic sizes)
SYMBOLIC_KERNELS = {
    # a decode step's product by a Conv1D weight (B contiguous along n): n sequences of one token
    "decode-addmm": (lambda x, w, b: torch.addmm(b, x.view(-1, 32), w),
                     lambda n: [torch.randn(n, 1, 32), torch.randn(32, 96), torch.randn(96)], "matmul"),
    # a prefill's projection by a Linear (A and B contiguous along k): n tokens
    "prefill-linear": (lambda x, w, b: torch.nn.functional.linear(x, w, b),
                       lambda n: [torch.randn(1, n, 32), torch.randn(48, 32), torch.randn(48)], "matmul"),
    # the scores of one new token against a key cache of n tokens, and the values they weigh
    "scores-kv-length": (lambda q, k: q @ k.transpose(-1, -2),
                         lambda n: [torch.randn(1, 4, 1, 16), torch.randn(1, 4, n, 16)], "matmul"),
    "attn-times-v": (lambda p, v: p.softmax(-1) @ v, lambda n: [torch.randn(1, 4, 1, n), torch.randn(1, 4, n, 16)],
                     "matmul"),
    "sdpa-causal": (_causal, lambda n: [torch.randn(1, 2, n, 8) for _ in range(3)], "attention"),
    "sdpa-mask": (_sdpa_mask, lambda n: [torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8),
                                         torch.randn(1, 1, n, n)], "attention"),
    "sdpa-decode": (_sdpa_decode, lambda n: [torch.randn(1, 4, 1, 16), torch.randn(1, 4, n, 16),
                                             torch.randn(1, 4, n, 16)], "attention"),
    # a lookup into a table whose row count is symbolic too (dynamic=True makes every dim so): its
    # bounds check once printed the size as ``(fuseg_s1)LL``, which the compiler refused, so the
    # lookup ran on ATen (found by tests/test_background_builds.py)
    "embedding-rows": (_embed, lambda n: [torch.randint(0, n, (1, n)), torch.randn(n + 3, 8)], "embedding"),
}


def _symbolic_kernels(compiler, kind: str) -> list:
    (program,) = compiler.compiled
    found = [(i, k) for i, k in program.kernels.items() if k.kind == kind]
    for i, _ in found:
        assert program.backend_of[i] == "cpp", program.passed_over.get(i)
    return [k for _, k in found]


@pytest.mark.parametrize("name", sorted(SYMBOLIC_KERNELS))
def test_matmul_and_attention_kernels_take_symbolic_sizes(name: str) -> None:
    """One plan for three sizes, its matmul or attention segment a generated kernel whose sizes are
    arguments (the symbols in its body), within float32's tolerance of eager; and the kernel's
    source is the same text a plan made at other sizes builds (one binary for every size)."""
    from runtime.autotune import fixed

    fn, make, kind = SYMBOLIC_KERNELS[name]
    with fixed("kernel"):  # the kernel wherever it is taken: its choice against ATen is not under test
        compiler = _run_dynamic(fn, make, (9, 11, 13), tol=1e-5)
        assert compiler.symbolic_refused == [] and len(compiler.compiled) == 1
        kernels = _symbolic_kernels(compiler, kind)
        assert kernels and all("fuseg_s" in k.body for k in kernels), [k.body for k in kernels]
        torch._dynamo.reset()
        other = _run_dynamic(fn, make, (17, 22), tol=1e-5)
        assert [k.source("cpu") for k in _symbolic_kernels(other, kind)] == [k.source("cpu") for k in kernels]


# -- sizes rounded by a division (CUDA's efficient attention: its logsumexp has ceil(L / 32) * 32 rows) --

@torch.library.custom_op("fuseg_test::pad_rows32", mutates_args=())
def _pad_rows32(x: torch.Tensor) -> torch.Tensor:
    import math

    out = x.new_zeros(math.ceil(x.shape[0] / 32) * 32, *x.shape[1:])
    out[: x.shape[0]] = x
    return out


@_pad_rows32.register_fake
def _(x):
    import math

    return x.new_empty(math.ceil(x.shape[0] / 32) * 32, *x.shape[1:])


def _padded(x):
    p = torch.ops.fuseg_test.pad_rows32(x.exp())
    return p * 2 + 1, p.sum(0), p[: x.shape[0] // 2].relu()


def test_a_size_rounded_up_by_a_division_is_planned_once() -> None:
    """A graph whose sizes are ``CeilToInt(IntTrueDiv(s, 32)) * 32`` (what CUDA's efficient
    attention gives AOTAutograd: qwen2's training on varying lengths on the H100 was specialized
    per length, 'a float size'): one symbolic plan for sizes on both sides of a multiple of 32
    (40 and 70 padded, 64 not; all in one size class of the column sum, whose kernel choice
    splits at 32 padded rows), against eager."""
    with pytest.warns(UserWarning, match="pad_rows32"):  # (the custom op runs on torch, reported)
        compiler = _run_dynamic(_padded, lambda n: [torch.randn(n, 5)], (40, 64, 70, 100))
    assert compiler.symbolic_refused == []
    assert len(compiler.compiled) == 1 and compiler.compiled[0].sizes is not None


# -- a row kernel's block is one decision for every row up to 512 (Note [a row's block]) ----------

#: reductions whose row length is symbolic; each is called first at a row of more than one warp (48),
#: then at rows of one warp or less (32, 20, 9) and at a longer one (300)
ROW_LENGTH_PROGRAMS = {
    "row-softmax": (lambda x: x.softmax(-1), lambda n: [torch.randn(3, n)]),
    "row-sum": (lambda x: x.sum(-1) * 2, lambda n: [torch.randn(4, n)]),
    "column-mean": (lambda x: x.mean(0) + 1, lambda n: [torch.randn(n, 6)]),
    # a bias's gradient over the tokens of a batch of two sequences: the row is 2 * n long
    "tokens-sum": (lambda g: g.reshape(-1, 8).sum(0), lambda n: [torch.randn(2, n, 8)]),
}


@pytest.mark.parametrize("name", sorted(ROW_LENGTH_PROGRAMS))
def test_a_row_of_one_warp_takes_the_plan_of_longer_rows(name: str) -> None:
    """Found on qwen2's training on changing lengths (perf.dynamic_shapes --train): the backward's
    plan, made at 24 tokens a sequence, held only for rows longer than one warp (its CUDA block,
    ``min(512, max(32, the row rounded up to warps))``, recorded ``rounded > 32``), so a batch of 16
    tokens a sequence, seen before the graph was dynamic, made a new plan: 0.4-0.6 s with no
    compiler run, on the CPU and on the H100."""
    fn, make = ROW_LENGTH_PROGRAMS[name]
    compiler = _run_dynamic(fn, make, (48, 32, 20, 9, 300))
    assert compiler.symbolic_refused == []
    assert len(compiler.compiled) == 1, [p.sizes.condition_text() for p in compiler.compiled]


def test_a_symbolic_rows_block_is_computed_at_each_launch() -> None:
    """See Note [a row's block]: the row kernel's CUDA block is an expression of the row's length, which
    the launch computes from the call's sizes (runtime/backends/cupy.py): the row rounded up to
    whole warps, from 32 to 512 threads, at any row a plan made at another one serves."""
    fn, make = ROW_LENGTH_PROGRAMS["row-softmax"]
    compiler = _run_dynamic(fn, make, (48,))
    (program,) = compiler.compiled
    rows = [k for k in program.kernels.values() if k.kind == "row"]
    assert rows, program.passed_over
    sizes = program.sizes
    (row_symbol,) = [s for s, src in sizes.sources.items() if sizes.hints[s] == 48]
    expr = sizes.python_expr(rows[0].block)
    for n in (1, 9, 32, 33, 48, 500, 512, 513, 4096):
        bound = {name: (n if s == row_symbol else sizes.hints[s]) for s, name in sizes.names.items()}
        assert eval(expr, {"max": max, "min": min}, bound) == min(512, max(32, -(-n // 32) * 32)), (n, expr)


def test_a_loop_longer_than_fission_evaluates_takes_the_same_plan() -> None:
    """Found with the guard above, on qwen2's training: a loop of symbolic length whose body has a
    branch test (labels shifted by one and padded, as a causal LM's loss does) was compared with
    Note [one loop per branch range]'s 4096 before its tests were read, so the plan held for at
    most 4096 positions; a symbolic loop is never split (its tests are not evaluated), so the
    comparison is no condition now."""
    fn = lambda x: torch.nn.functional.pad(x[:, 1:], (0, 1), value=-100.0) * 2  # noqa: E731
    compiler = _run_dynamic(fn, lambda n: [torch.randn(2, n)], (9, 5000, 11))
    assert compiler.symbolic_refused == []
    assert len(compiler.compiled) == 1, [p.sizes.condition_text() for p in compiler.compiled]
