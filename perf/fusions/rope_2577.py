# The fusion of NVIDIA/Fuser#2577 (../shared/seeds/002): LitGPT's QKV split and RoPE (16 heads, 4
# query groups, head size 32, rope_n_elem 8; bf16 with float math), as Thunder's nvFuser executor
# hands it to nvFuser. The issue prints nvFuser's IR of this fusion, not the script: this script was
# written by hand from that IR (the same views, slices, casts and the cat of the rotated halves) for
# `segmenter.from_nvfuser`, which reads it as data and never runs it. The x input's last dim is
# symbolic (-1), as in the T2; `inputs` below binds it (768).
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[1024, 8], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[1, 0])
    T1 = fd.define_tensor(shape=[1024, 8], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[1, 0])
    T2 = fd.define_tensor(shape=[2, 1024, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    S3 = fd.define_scalar(2, dtype=DataType.Int)
    S4 = fd.define_scalar(1024, dtype=DataType.Int)
    S5 = fd.define_scalar(4, dtype=DataType.Int)
    S6 = fd.define_scalar(6, dtype=DataType.Int)
    S7 = fd.define_scalar(32, dtype=DataType.Int)
    V8 = fd.define_vector([S3, S4, S5, S6, S7], dtype=DataType.Int)
    T9 = fd.ops.reshape(T2, new_shape=V8)
    T10 = fd.ops.permute(T9, dims=[0, 2, 3, 1, 4])
    # v: the last of the six heads of each group, expanded to the group's four query heads
    T11 = fd.ops.slice(T10, start_indices=[0, 0, 5, 0, 0], end_indices=[2, 4, 6, 1024, 32], strides=[1, 1, 1, 1, 1], manual_normalization=0)
    T12 = fd.ops.set(T11)
    T13 = fd.ops.expand(T12, shape=[2, 4, 4, 1024, 32])
    T14 = fd.ops.reshape(T13, new_shape=[2, 16, 1024, 32])
    # q: the first four heads of each group
    T15 = fd.ops.slice(T10, start_indices=[0, 0, 0, 0, 0], end_indices=[2, 4, 4, 1024, 32], strides=[1, 1, 1, 1, 1], manual_normalization=0)
    T16 = fd.ops.reshape(T15, new_shape=[2, 16, 1024, 32])
    T17 = fd.ops.slice(T16, start_indices=[0, 0, 0, 0], end_indices=[2, 16, 1024, 8], strides=[1, 1, 1, 1], manual_normalization=0)
    T18 = fd.ops.cast(T17, dtype=DataType.Float)
    T19 = fd.ops.broadcast_in_dim(T0, shape=[2, 16, 1024, 8], broadcast_dims=[2, 3])
    T20 = fd.ops.cast(T19, dtype=DataType.Float)
    T21 = fd.ops.mul(T18, T20)
    T22 = fd.ops.slice(T17, start_indices=[0, 0, 0, 4], end_indices=[2, 16, 1024, 8], strides=[1, 1, 1, 1], manual_normalization=0)
    T23 = fd.ops.cast(T22, dtype=DataType.Float)
    T24 = fd.ops.neg(T23)
    T25 = fd.ops.cast(T24, dtype=DataType.BFloat16)
    T26 = fd.ops.slice(T17, start_indices=[0, 0, 0, 0], end_indices=[2, 16, 1024, 4], strides=[1, 1, 1, 1], manual_normalization=0)
    T27 = fd.ops.cat([T25, T26], dim=-1, manual_padding=0)
    T28 = fd.ops.cast(T27, dtype=DataType.Float)
    T29 = fd.ops.broadcast_in_dim(T1, shape=[2, 16, 1024, 8], broadcast_dims=[2, 3])
    T30 = fd.ops.cast(T29, dtype=DataType.Float)
    T31 = fd.ops.mul(T28, T30)
    T32 = fd.ops.add(T21, T31)
    T33 = fd.ops.cast(T32, dtype=DataType.BFloat16)
    T34 = fd.ops.slice(T16, start_indices=[0, 0, 0, 8], end_indices=[2, 16, 1024, 32], strides=[1, 1, 1, 1], manual_normalization=0)
    T35 = fd.ops.cat([T33, T34], dim=-1, manual_padding=0)
    # k: the fifth head of each group, expanded like v, then the same rotation as q
    T36 = fd.ops.slice(T10, start_indices=[0, 0, 4, 0, 0], end_indices=[2, 4, 5, 1024, 32], strides=[1, 1, 1, 1, 1], manual_normalization=0)
    T37 = fd.ops.set(T36)
    T38 = fd.ops.expand(T37, shape=[2, 4, 4, 1024, 32])
    T39 = fd.ops.reshape(T38, new_shape=[2, 16, 1024, 32])
    T40 = fd.ops.slice(T39, start_indices=[0, 0, 0, 0], end_indices=[2, 16, 1024, 8], strides=[1, 1, 1, 1], manual_normalization=0)
    T41 = fd.ops.cast(T40, dtype=DataType.Float)
    T42 = fd.ops.mul(T41, T20)
    T43 = fd.ops.slice(T40, start_indices=[0, 0, 0, 4], end_indices=[2, 16, 1024, 8], strides=[1, 1, 1, 1], manual_normalization=0)
    T44 = fd.ops.cast(T43, dtype=DataType.Float)
    T45 = fd.ops.neg(T44)
    T46 = fd.ops.cast(T45, dtype=DataType.BFloat16)
    T47 = fd.ops.slice(T40, start_indices=[0, 0, 0, 0], end_indices=[2, 16, 1024, 4], strides=[1, 1, 1, 1], manual_normalization=0)
    T48 = fd.ops.cat([T46, T47], dim=-1, manual_padding=0)
    T49 = fd.ops.cast(T48, dtype=DataType.Float)
    T50 = fd.ops.mul(T49, T30)
    T51 = fd.ops.add(T42, T50)
    T52 = fd.ops.cast(T51, dtype=DataType.BFloat16)
    T53 = fd.ops.slice(T39, start_indices=[0, 0, 0, 8], end_indices=[2, 16, 1024, 32], strides=[1, 1, 1, 1], manual_normalization=0)
    T54 = fd.ops.cat([T52, T53], dim=-1, manual_padding=0)
    fd.add_output(T14)
    fd.add_output(T35)
    fd.add_output(T54)


with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.testing.make_tensor((1024, 8), dtype=torch.bfloat16, device='cuda:0'),
    torch.testing.make_tensor((1024, 8), dtype=torch.bfloat16, device='cuda:0'),
    torch.testing.make_tensor((2, 1024, 768), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
