"""Hostile and broken nvFuser scripts: each is refused with the line and the call named, and
nothing in it runs (Note [a fusion script is data] in segmenter/formats/nvfuser/script.py)."""

from __future__ import annotations

import builtins
import os
import textwrap

import pytest
import torch

from segmenter import from_nvfuser
from segmenter.formats.nvfuser import script as nvfuser_script
from segmenter.formats.serialize import GraphFormatError

HEAD = "from nvfuser import FusionDefinition, DataType\n\n\ndef f(fd: FusionDefinition) -> None:\n"
T0 = "T0 = fd.define_tensor(shape=[2, 3], contiguity=[True, True], dtype=DataType.Float)"


def script(*lines: str, tail: str = "") -> str:
    return HEAD + textwrap.indent("\n".join([T0, *lines]), "    ") + "\n" + tail


def refused(source: str, message: str, inputs: list | None = None) -> None:
    with pytest.raises(GraphFormatError, match=message):
        from_nvfuser(source, inputs)


# (name, script, the refusal: its line and what it names)
HOSTILE = [
    ("dunder_import", script('__import__("os").system("touch /tmp/pwned")'),
     r"line 6: __import__\(\.\.\.\)\.system\(\.\.\.\) is not a frontend call"),
    ("import_in_body", script("import os"), "line 6: a Import statement in a fusion is not a frontend call"),
    ("import_at_module_level", "import os\n" + script("fd.add_output(T0)"),
     "line 1: import of os: a fusion script imports only torch and nvFuser"),
    ("from_import", "from os import system\n" + script("fd.add_output(T0)"), "line 1: import from os"),
    ("eval", script('T1 = eval("1 + 1")'), r"line 6: eval\(\.\.\.\) is not a frontend call"),
    ("exec", script('exec("import os")'), r"line 6: exec\(\.\.\.\) is not a frontend call"),
    ("getattr", script('T1 = getattr(fd, "ops")'), r"line 6: getattr\(\.\.\.\) is not a frontend call"),
    ("open", script('T1 = open("/etc/passwd")'), r"line 6: open\(\.\.\.\) is not a frontend call"),
    ("torch_call", script("T1 = torch.ones(3)"), r"line 6: torch\.ones\(\.\.\.\) is not a frontend call"),
    ("attribute_chain", script("T1 = fd.ops.add.__globals__"), r"line 6: attribute fd\.ops\.add\.__globals__"),
    ("class_chain", script("T1 = fd.ops.__class__(fd)"), r"line 6: fd\.ops\.__class__ is not an op"),
    ("dunder_method", script("T1 = fd.__init__(T0)"), r"line 6: fd\.__init__\(\.\.\.\) is not a frontend call"),
    ("method_of_value", script("T1 = T0.__class__()"), r"line 6: T0\.__class__\(\.\.\.\) is not a frontend call"),
    ("unknown_op", script("T1 = fd.ops.mystery(T0)"), r"line 6: fd\.ops\.mystery is not an op this reader knows"),
    ("random_op", script("T1 = fd.ops.rand_like(T0)"), r"line 6: fd\.ops\.rand_like is not an op"),
    ("dunder_keyword", script("T1 = fd.ops.add(T0, T0, __class__=1)"), "line 6: ops.add: keyword '__class__'"),
    ("star_args", script("T1 = fd.ops.add(*[T0, T0])"), r"line 6: ops\.add: \*args and \*\*kwargs are not read"),
    ("lambda", script("T1 = (lambda: 0)()"), r"line 6: \(an expression\)\(\.\.\.\) is not a frontend call"),
    ("comprehension", script("T1 = [fd.ops.exp(T0) for _ in range(3)]"), "line 6: a ListComp expression is not read"),
    ("loop", script("for i in range(3):", "    fd.add_output(T0)"), "line 6: a For statement in a fusion"),
    ("if", script("if True:", "    fd.add_output(T0)"), "line 6: a If statement in a fusion"),
    ("fstring", script('T1 = f"{T0}"'), "line 6: a JoinedStr expression is not read"),
    ("string_argument", script('T1 = fd.ops.cast(T0, dtype="float")'), "line 6: a str constant is not a frontend value"),
    ("undefined_name", script("T1 = fd.ops.exp(secret)"), "line 6: undefined name secret"),
    ("fake_dtype", script("T1 = fd.ops.cast(T0, dtype=DataType.__class__)"), r"line 6: DataType\.__class__ is not a dtype"),
    ("other_attribute", script("T1 = fd.ops.cast(T0, dtype=os.environ)"), r"line 6: attribute os\.environ"),
    ("float_of_text", script('S1 = fd.define_scalar(float("1e999999"))'), r'line 6: float\(\.\.\.\) is read only as'),
    ("huge_literal", script("S1 = fd.define_scalar(10 ** 30)"), "line 6: arithmetic other than"),
    ("huge_integer", script(f"S1 = fd.define_scalar({2**70})"), "line 6: integer .* beyond 64 bits"),
    ("huge_product", script("S1 = fd.define_scalar(4611686018427387904 * 4)"), "line 6: integer arithmetic beyond 64 bits"),
    ("huge_size", HEAD + "    T0 = fd.define_tensor(shape=[2**47, 2**47], dtype=DataType.Float)\n",
     r"line 5: arithmetic other than"),
    ("huge_shape", HEAD + "    T0 = fd.define_tensor(shape=[281474976710655, 281474976710655], dtype=DataType.Float)\n",
     r"line 5: fd\.define_tensor: an input of \[281474976710655, 281474976710655\] addresses .* bytes"),
    ("size_beyond_bound", HEAD + f"    T0 = fd.define_tensor(shape=[{2**49}], dtype=DataType.Float)\n",
     r"line 5: fd\.define_tensor: shape\[0\] must be an integer in"),
    ("rank_beyond_bound", HEAD + f"    T0 = fd.define_tensor(shape={[1] * 65}, dtype=DataType.Float)\n",
     "line 5: fd.define_tensor: shape must be a list of at most 64 integers"),
    ("huge_reshape", script("T1 = fd.ops.reshape(T0, new_shape=[2**40, 2**40])"), "line 6: arithmetic other than"),
    ("huge_full", script("T1 = fd.ops.full(shape=[100000000, 100000000, 100000], fill_value=0.0, dtype=DataType.Float)"),
     r"line 6: fd\.ops\.full: shape .* elements"),
    ("huge_pad", script("T1 = fd.ops.pad(T0, [0, 281474976710655])"), r"line 6: fd\.ops\.pad: a torch.float32 result .* bytes"),
    ("negative_size", HEAD + "    T0 = fd.define_tensor(shape=[-2, 3], dtype=DataType.Float)\n",
     r"line 5: fd\.define_tensor: shape\[0\] must be an integer in \[-1"),
    ("bool_as_int", script("T1 = fd.ops.sum(T0, dims=[True])"), r"line 6: fd\.ops\.sum: dims\[0\] must be an integer"),
    ("module_statement", script("fd.add_output(T0)", tail="print('hi')\n"),
     "line 7: a Expr statement at module level is not read"),
    ("module_assignment", script("fd.add_output(T0)", tail="x = open('/etc/passwd')\n"),
     r"line 7: x = \.\.\.: only numbers and inputs"),
    ("decorated", script("fd.add_output(T0)").replace("def f", "@staticmethod\ndef f"),
     "line 5: function f: decorators are not read"),
    ("not_a_fusion", script("fd.add_output(T0)", tail="def helper(x):\n    return x\n"),
     "line 7: function helper: not a fusion definition"),
    ("other_with", 'with open("/etc/passwd") as fd:\n    pass\n', "line 1: a with-block other than"),
    ("subclass_method", "from nvfuser import FusionDefinition\nclass M(FusionDefinition):\n"
                        "    def schedule(self):\n        pass\n", "line 3: class M: only its definition"),
    ("inputs_call", script("fd.add_output(T0)", tail="inputs = [os.system('touch /tmp/pwned')]\n"),
     r"line 7: inputs: os\.system\(\.\.\.\) is not a tensor constructor"),
    ("inputs_load", script("fd.add_output(T0)", tail="inputs = [torch.load('weights.pt')]\n"),
     r"line 7: inputs: torch\.load\(\.\.\.\) is not a tensor constructor"),
    ("inputs_method", script("fd.add_output(T0)", tail="inputs = [torch.randn(2, 3).numpy()]\n"),
     r"line 7: inputs: \.numpy\(\.\.\.\) is not read"),
    ("inputs_device", script("fd.add_output(T0)", tail="inputs = [torch.randn(2, 3, device='../../etc')]\n"),
     "line 7: inputs: device must be"),
    ("from_pytorch_of_other", script("T1 = fd.from_pytorch(T0)", "fd.add_output(T1)"),
     r"line 6: fd\.from_pytorch: reads only fd\.from_pytorch\(inputs\[i\]\)"),
    ("contiguity_of_text", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], contiguity=[True, 'x'])\n",
     "line 5: a str constant is not a frontend value"),
    ("contiguity_of_numbers", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], contiguity=[True, 2])\n",
     r"line 5: fd\.define_tensor: contiguity must be a list of True/False/None"),
    ("contiguity_too_short", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], contiguity=[True])\n",
     r"line 5: fd\.define_tensor: contiguity has 1 entries for 2 dims"),
    ("stride_order_repeated", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], contiguity=[True, True], stride_order=[0, 0])\n",
     r"line 5: fd\.define_tensor: stride_order \[0, 0\] is not a permutation of the 2 dims"),
    ("stride_order_out_of_range", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], stride_order=[0, 5])\n",
     r"line 5: fd\.define_tensor: stride_order \[0, 5\] is not a permutation"),
    ("stride_order_too_short", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], contiguity=True, stride_order=[0])\n",
     r"line 5: fd\.define_tensor: stride_order \[0\] is not a permutation"),
    ("stride_order_huge", HEAD + f"    T0 = fd.define_tensor(shape=[2, 3], stride_order=[0, {2**62}])\n",
     r"line 5: fd\.define_tensor: stride_order\[1\] must be an integer in \[-64, 64\]"),
    ("is_cpu_tensor", HEAD + "    T0 = fd.define_tensor(shape=[2, 3], contiguity=[True, True], is_cpu=True)\n",
     r"line 5: fd\.define_tensor: is_cpu=True is for 0-dim tensors"),
    ("no_output", script(), "the fusion adds no output"),
    ("syntax", "def f(fd):\n    T0 = fd.define_tensor(shape=[2,\n", "line 2: not Python"),
    ("not_a_fusion_at_all", "x = 1\n", "no fusion in the script"),
]


@pytest.mark.parametrize("source,message", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_script_is_refused_naming_the_line_and_call(source: str, message: str) -> None:
    refused(source, message)


def test_nothing_in_a_script_runs(monkeypatch, tmp_path) -> None:
    """A script whose every statement would act if run: it is refused and nothing ran (no import,
    no file). The reader calls no builtin that runs code."""
    marker = tmp_path / "pwned"
    imported: list[str] = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):  # noqa: ANN001, ANN202 - builtins.__import__'s signature
        imported.append(name)
        return real_import(name, *args, **kwargs)

    source = script(f'__import__("os").system("touch {marker}")', f'open("{marker}", "w")')
    monkeypatch.setattr(builtins, "__import__", spy)
    with pytest.raises(GraphFormatError):
        from_nvfuser(source)
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert not marker.exists() and "os" not in imported


def test_deep_nesting_is_refused_without_a_recursion_error() -> None:
    deep = "fd.ops.exp(" * 40 + "T0" + ")" * 40
    refused(script(f"T1 = {deep}"), "line 6: expressions nested deeper than 32")
    parens = "(" * 5000 + "T0" + ")" * 5000  # the parser's own limit: a one-line refusal either way
    refused(script(f"T1 = {parens}"), "not Python|not a fusion script")


def test_long_names_and_long_files_are_refused(monkeypatch) -> None:
    refused(script(f"{'T' * 300} = fd.ops.exp(T0)"), "line 6: a name of 300 characters")
    refused(" " * (nvfuser_script.MAX_SOURCE + 1), "characters")
    monkeypatch.setattr(nvfuser_script, "MAX_CALLS", 3)
    refused(script(*[f"T{k} = fd.ops.exp(T0)" for k in range(1, 5)]), "more than 3 calls")


def test_torch_refusals_name_the_line_and_call() -> None:
    refused(script("T1 = fd.ops.squeeze(T0, dims=[0])"), r"line 6: fd\.ops\.squeeze: dims \[0\] of \[2, 3\] are not of size 1")
    refused(script("T1 = fd.ops.add(T0, fd.ops.full([4], 1.0, DataType.Float))"),
            r"line 6: fd\.ops\.add: RuntimeError: .*broadcast")
    refused(script("T1 = fd.ops.broadcast_in_dim(T0, shape=[2, 3, 4], broadcast_dims=[1, 0])"),
            "line 6: fd.ops.broadcast_in_dim: broadcast_dims .* increasing")
    refused(script("T1 = fd.ops.where(T0, T0, T0)"), "line 6: fd.ops.where: the condition is torch.float32, not Bool")
    refused(script("fd.add_output(fd.ops.sum(T0, dims=[0]), T0)"), "cannot be written into input T0")
    refused(script("T1 = fd.ops.exp(T0)", "fd.add_output(T1, T1)"), "alias_input must be an input")
    refused(script("fd.add_output(T0, fd.ops.reshape(T0, [3, 2]))"), "alias_input must be an input")


def test_values_are_checked_when_read_not_only_parsed() -> None:
    refused(script("T1 = fd.ops.slice(T0, [0, 0], [2, 3], [1, 0])"), r"strides\[1\] must be an integer in \[1,")
    refused(script("T1 = fd.ops.slice(T0, [0, 0], [2, 9], manual_normalization=True)"), "manual_normalization")
    refused(script("T1 = fd.ops.pad(T0, [1, 2, 3])"), "two widths a dim")
    refused(script("T1 = fd.ops.cat([T0, fd.ops.cast(T0, DataType.Half)], 0)"), "different dtypes")
    refused(script("T1 = fd.ops.var_mean(T0, [0], correction=-1)"), r"correction must be an integer in \[0,")
    refused(script("T1 = fd.ops.permute(T0, dims=[0, 0])"), "names a dim twice")
    refused(script("T1, T2 = fd.ops.exp(T0)"), "returns one value, assigned to 2 names")
    refused(script("S1 = fd.define_scalar(1.5, dtype=DataType.Int)"), "is not a torch.int64 value")
    refused(script("T1 = fd.ops.iota(4, 0.5, 1, DataType.Int)"), "start must be a int scalar")


def test_an_unreadable_file_is_a_one_line_cli_error(capsys, tmp_path) -> None:
    from perf.tools.cli import main

    path = tmp_path / "repro.py"
    path.write_text(script('__import__("os").system("true")'))
    assert main(["segment", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuseg: error: line 6: __import__(...).system(...) is not a frontend call") and err.count("\n") == 1


def test_scripts_are_read_not_run_even_when_valid(tmp_path) -> None:
    """A valid fusion whose module also holds fd.execute(inputs): reading it never executes it
    (nvfuser is not installed here: an import would fail)."""
    source = script("fd.add_output(fd.ops.exp(T0))", tail="with FusionDefinition() as fd:\n    f(fd)\n"
                    "inputs = [torch.randn(2, 3, device='cuda:0')]\nout = fd.execute(inputs)\n")
    graph = from_nvfuser(source, [torch.randn(2, 3)])
    assert [n.op for n in graph.nodes] == ["aten.exp.default"] and os.environ.get("PWNED") is None
