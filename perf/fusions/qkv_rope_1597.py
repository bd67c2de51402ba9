# The fusion of NVIDIA/Fuser#1597 ("Improve performance on RoPE (and code around it)"): LitGPT's QKV
# split and RoPE as Thunder's nvFuser executor hands it to nvFuser, at the Mistral-7B config the issue
# settles on (32 heads, 8 query groups, head size 128, full rotary). The issue quotes nvFuser's
# segmentation of it ("segmented into eight kernels. The alias stuff made three of them no-op but the
# rest five contain non-meta ops like cast, neg, mul, and add") but not the script: this script was
# written by hand for `segmenter.from_nvfuser`, which reads it as data and never runs it. Batch and
# sequence sizes are symbolic (-1) and read back with fd.ops.size, so the same script binds to any
# (B, T); `inputs` below gives B=1, T=4096.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id1(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[-1, -1, 6144], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[-1, 128], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[1, 0])
    T2 = fd.define_tensor(shape=[-1, 128], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[1, 0])
    S3 = fd.ops.size(T0, 0)
    S4 = fd.ops.size(T0, 1)
    V5 = fd.define_vector([S3, S4, 8, 6, 128], dtype=DataType.Int)
    T6 = fd.ops.reshape(T0, new_shape=V5)
    T7 = fd.ops.permute(T6, dims=[0, 2, 3, 1, 4])
    T8 = fd.ops.slice(T7, start_indices=[0, 0, 0, 0, 0], end_indices=[S3, 8, 4, S4, 128], strides=[1, 1, 1, 1, 1])
    T9 = fd.ops.slice(T7, start_indices=[0, 0, 4, 0, 0], end_indices=[S3, 8, 5, S4, 128], strides=[1, 1, 1, 1, 1])
    T10 = fd.ops.slice(T7, start_indices=[0, 0, 5, 0, 0], end_indices=[S3, 8, 6, S4, 128], strides=[1, 1, 1, 1, 1])
    T11 = fd.ops.broadcast_in_dim(T9, shape=[S3, 8, 4, S4, 128], broadcast_dims=[0, 1, 2, 3, 4])
    T12 = fd.ops.broadcast_in_dim(T10, shape=[S3, 8, 4, S4, 128], broadcast_dims=[0, 1, 2, 3, 4])
    V13 = fd.define_vector([S3, 32, S4, 128], dtype=DataType.Int)
    T14 = fd.ops.reshape(T8, new_shape=V13)
    T15 = fd.ops.reshape(T11, new_shape=V13)
    T16 = fd.ops.reshape(T12, new_shape=V13)
    # q: rotate the halves, then cos and sin (full rotary: all 128 features)
    T17 = fd.ops.slice(T14, start_indices=[0, 0, 0, 0], end_indices=[S3, 32, S4, 64], strides=[1, 1, 1, 1])
    T18 = fd.ops.slice(T14, start_indices=[0, 0, 0, 64], end_indices=[S3, 32, S4, 128], strides=[1, 1, 1, 1])
    T19 = fd.ops.cast(T18, dtype=DataType.Float)
    T20 = fd.ops.neg(T19)
    T21 = fd.ops.cast(T20, dtype=DataType.BFloat16)
    T22 = fd.ops.cat([T21, T17], dim=-1)
    T23 = fd.ops.broadcast_in_dim(T1, shape=[S3, 32, S4, 128], broadcast_dims=[2, 3])
    T24 = fd.ops.broadcast_in_dim(T2, shape=[S3, 32, S4, 128], broadcast_dims=[2, 3])
    T25 = fd.ops.cast(T14, dtype=DataType.Float)
    T26 = fd.ops.cast(T23, dtype=DataType.Float)
    T27 = fd.ops.mul(T25, T26)
    T28 = fd.ops.cast(T22, dtype=DataType.Float)
    T29 = fd.ops.cast(T24, dtype=DataType.Float)
    T30 = fd.ops.mul(T28, T29)
    T31 = fd.ops.add(T27, T30)
    T32 = fd.ops.cast(T31, dtype=DataType.BFloat16)
    # k: the same
    T33 = fd.ops.slice(T15, start_indices=[0, 0, 0, 0], end_indices=[S3, 32, S4, 64], strides=[1, 1, 1, 1])
    T34 = fd.ops.slice(T15, start_indices=[0, 0, 0, 64], end_indices=[S3, 32, S4, 128], strides=[1, 1, 1, 1])
    T35 = fd.ops.cast(T34, dtype=DataType.Float)
    T36 = fd.ops.neg(T35)
    T37 = fd.ops.cast(T36, dtype=DataType.BFloat16)
    T38 = fd.ops.cat([T37, T33], dim=-1)
    T39 = fd.ops.cast(T15, dtype=DataType.Float)
    T40 = fd.ops.mul(T39, T26)
    T41 = fd.ops.cast(T38, dtype=DataType.Float)
    T42 = fd.ops.mul(T41, T29)
    T43 = fd.ops.add(T40, T42)
    T44 = fd.ops.cast(T43, dtype=DataType.BFloat16)
    fd.add_output(T32)
    fd.add_output(T44)
    fd.add_output(T16)


with FusionDefinition() as fd:
    nvfuser_fusion_id1(fd)

inputs = [
    torch.testing.make_tensor((1, 4096, 6144), dtype=torch.bfloat16, device='cuda:0'),
    torch.testing.make_tensor((4096, 128), dtype=torch.bfloat16, device='cuda:0'),
    torch.testing.make_tensor((4096, 128), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
