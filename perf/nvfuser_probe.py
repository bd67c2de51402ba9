"""Does nvFuser's classic frontend import and run here? Prints what it finds (GPU validation)."""

import inspect
import traceback

import torch

print("torch", torch.__version__)
try:
    import nvfuser
    from nvfuser import DataType, FusionDefinition
    print("nvfuser", getattr(nvfuser, "__version__", "?"), "imported")
except Exception:
    traceback.print_exc()
    raise SystemExit(1) from None

with FusionDefinition() as fd:
    t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False,
                          stride_order=[1, 0])
    t1 = fd.ops.exp(t0)
    t2 = fd.ops.sum(t1, [1], False, DataType.Float)
    t3 = fd.ops.broadcast_in_dim(t2, shape=[64, 128], broadcast_dims=[0])
    t4 = fd.ops.div(t1, t3)
    fd.add_output(t4)
x = torch.randn(64, 128, device="cuda")
out = fd.execute([x], profile=True)[0]
torch.testing.assert_close(out, torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
print("softmax fusion ran and matches torch")
try:
    prof = fd.profile()
    print("profile: segments =", prof.segments, [a for a in dir(prof) if not a.startswith("_")])
except Exception:
    traceback.print_exc()
for name in ("define_tensor", "define_scalar", "add_output", "execute"):
    f = getattr(fd, name)
    print(f"--- fd.{name}", (f.__doc__ or "")[:600])
ops = [o for o in dir(fd.ops) if not o.startswith("_")]
print("fd.ops:", " ".join(ops))
for name in ("sum", "max", "var_mean", "broadcast_in_dim", "slice", "pad", "cat", "reshape", "permute", "squeeze",
             "expand", "cast", "where", "clamp"):
    f = getattr(fd.ops, name, None)
    print(f"--- fd.ops.{name}", (f.__doc__ or "")[:500] if f is not None else "MISSING")
print(inspect.signature(FusionDefinition.execute))
