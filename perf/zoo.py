"""Built-in example programs: no download, random weights, small defaults for CPU.

Each entry's factory returns ``(fn_or_module, example_inputs)``, the same contract as a user's
``package.module:factory`` target. The full model zoo (real configs, fake weights, GPU dtypes)
entries at real model sizes (``rope-*-7b``, ``llama2-7b``, ``gpt2-124m``...) use meta tensors: their
graphs are captured, segmented and profiled without memory; ``fuseg bench`` on a GPU materializes
the RoPE ones with random values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ZOO", "ZooEntry", "get", "rope_it_all"]

Factory = Callable[[], tuple[Any, list[Any]]]


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    batch: int
    seq: int
    dtype: torch.dtype
    factory: Factory


# --- LitGPT-style RoPE block (the graph of NVIDIA/Fuser#2577, seeds/002) ----------------------

def _split_qkv(x: torch.Tensor, n_head: int, n_query_groups: int, head_size: int) -> tuple[torch.Tensor, ...]:
    B, T, _ = x.shape
    q_per_kv = n_head // n_query_groups
    qkv = x.view(B, T, n_query_groups, q_per_kv + 2, head_size).permute(0, 2, 3, 1, 4)
    q, k, v = qkv.split((q_per_kv, 1, 1), dim=2)
    k = k.expand(B, n_query_groups, q_per_kv, T, head_size)
    v = v.expand(B, n_query_groups, q_per_kv, T, head_size)
    return (q.reshape(B, -1, T, head_size), k.reshape(B, -1, T, head_size), v.reshape(B, -1, T, head_size))


def _rope_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_n_elem: int) -> torch.Tensor:
    x_rope = x[..., :rope_n_elem]
    x1 = x_rope[..., : rope_n_elem // 2]
    x2 = x_rope[..., rope_n_elem // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    roped = (x_rope * cos) + (rotated * sin)
    return torch.cat((roped.to(dtype=x.dtype), x[..., rope_n_elem:]), dim=-1)


def rope_it_all(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_head: int, n_query_groups: int,
    head_size: int, rope_n_elem: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _split_qkv(x, n_head, n_query_groups, head_size)
    return _rope_one(q, cos, sin, rope_n_elem), _rope_one(k, cos, sin, rope_n_elem), v


def _rope(B: int, T: int, n_head: int, groups: int, head: int, rope_n_elem: int, dtype: torch.dtype,
          device: str = "cpu") -> Factory:
    def make() -> tuple[Any, list[Any]]:
        g = torch.Generator().manual_seed(0)
        if device == "meta":  # real model sizes: shapes only, no memory (profiling, not running)
            x = torch.empty(B, T, (n_head + 2 * groups) * head, dtype=dtype, device="meta")
            cos = torch.empty(T, rope_n_elem, dtype=dtype, device="meta")
            sin = torch.empty(T, rope_n_elem, dtype=dtype, device="meta")
        else:
            x = torch.randn(B, T, (n_head + 2 * groups) * head, generator=g).to(dtype)
            cos = torch.randn(T, rope_n_elem, generator=g).to(dtype)
            sin = torch.randn(T, rope_n_elem, generator=g).to(dtype)
        fn = functools.partial(rope_it_all, n_head=n_head, n_query_groups=groups, head_size=head, rope_n_elem=rope_n_elem)
        fn.__name__ = "rope_it_all"  # type: ignore[attr-defined]
        return fn, [x, cos, sin]
    return make


# --- small graphs -----------------------------------------------------------------------------

class _MLP(torch.nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _RMSNorm(torch.nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _module(make: Callable[[], torch.nn.Module], *shape: int) -> Factory:
    def factory() -> tuple[Any, list[Any]]:
        torch.manual_seed(0)
        return make().eval(), [torch.randn(*shape)]
    return factory


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


# --- transformers models from configs (random weights, no download) ---------------------------

def _hf(kind: str, layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16) -> Factory:
    def factory() -> tuple[Any, list[Any]]:
        import transformers

        torch.manual_seed(0)
        common = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=2 * hidden, vocab_size=128, max_position_embeddings=2 * seq)
        if kind == "gpt2":
            cfg = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=128,
                                          n_positions=2 * seq, bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2Model(cfg)
        elif kind == "bert":
            model = transformers.BertModel(transformers.BertConfig(**common))
        else:
            cfg_cls, model_cls = {
                "llama": (transformers.LlamaConfig, transformers.LlamaModel),
                "mistral": (transformers.MistralConfig, transformers.MistralModel),
                "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
            }[kind]
            model = model_cls(cfg_cls(num_key_value_heads=heads // 2, **common))
        model.config.use_cache = False
        ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(0))
        return model.eval(), [ids]
    return factory


# Real model sizes, built on the meta device: fake weights, no memory; captured and profiled, not run.
_FULL = {
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "llama": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000),
    "mistral": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=32000),
    "qwen2": dict(num_hidden_layers=28, hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                  num_key_value_heads=4, vocab_size=152064),
    "bert": dict(num_hidden_layers=12, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                 vocab_size=30522),
}


def _hf_full(kind: str, seq: int, dtype: torch.dtype) -> Factory:
    def factory() -> tuple[Any, list[Any]]:
        import transformers

        cfg_cls, model_cls = {
            "gpt2": (transformers.GPT2Config, transformers.GPT2Model),
            "llama": (transformers.LlamaConfig, transformers.LlamaModel),
            "mistral": (transformers.MistralConfig, transformers.MistralModel),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
            "bert": (transformers.BertConfig, transformers.BertModel),
        }[kind]
        with torch.device("meta"):
            model = model_cls(cfg_cls(use_cache=False, **_FULL[kind])).to(dtype).eval()
        return model, [torch.zeros(1, seq, dtype=torch.long, device="meta")]
    return factory


ZOO: dict[str, ZooEntry] = {e.name: e for e in [
    ZooEntry("rope-seed", "LitGPT RoPE of NVIDIA/Fuser#2577: 16 heads, 4 groups, head 32, rope 8",
             2, 1024, torch.float32, _rope(2, 1024, 16, 4, 32, 8, torch.float32)),
    ZooEntry("rope-llama2-7b", "RoPE of Llama-2-7B: 32 heads, 32 groups, head 128, full rotary (meta: profile only)",
             2, 4096, torch.bfloat16, _rope(2, 4096, 32, 32, 128, 128, torch.bfloat16, "meta")),
    ZooEntry("rope-llama3-8b", "RoPE of Llama-3-8B: 32 heads, 8 groups, head 128, full rotary (meta: profile only)",
             1, 8192, torch.bfloat16, _rope(1, 8192, 32, 8, 128, 128, torch.bfloat16, "meta")),
    ZooEntry("rope-qwen2-7b", "RoPE of Qwen2-7B: 28 heads, 4 groups, head 128, full rotary (meta: profile only)",
             1, 4096, torch.bfloat16, _rope(1, 4096, 28, 4, 128, 128, torch.bfloat16, "meta")),
    ZooEntry("rope-mistral-7b", "RoPE of Mistral-7B: 32 heads, 8 groups, head 128, full rotary (meta: profile only)",
             1, 4096, torch.bfloat16, _rope(1, 4096, 32, 8, 128, 128, torch.bfloat16, "meta")),
    ZooEntry("mlp", "Linear -> GELU -> Linear, 64 -> 256 -> 64", 8, 1, torch.float32,
             _module(lambda: _MLP(64, 256), 8, 64)),
    ZooEntry("softmax", "softmax over the last dim of a [32, 128] tensor", 32, 128, torch.float32,
             lambda: (_softmax, [torch.randn(32, 128)])),
    ZooEntry("layer-norm", "nn.LayerNorm(128) on [32, 128]", 32, 128, torch.float32,
             _module(lambda: torch.nn.LayerNorm(128), 32, 128)),
    ZooEntry("rms-norm", "LLaMA-style RMSNorm(128) on [32, 128]", 32, 128, torch.float32,
             _module(lambda: _RMSNorm(128), 32, 128)),
    ZooEntry("softmax-4k", "softmax over the last dim of a [4096, 4096] tensor (large: GPU benchmarks)", 4096, 4096,
             torch.float32, lambda: (_softmax, [torch.randn(4096, 4096)])),
    ZooEntry("layer-norm-4k", "nn.LayerNorm(4096) on [8192, 4096] (large: GPU benchmarks)", 8192, 4096, torch.float32,
             _module(lambda: torch.nn.LayerNorm(4096), 8192, 4096)),
    ZooEntry("rms-norm-4k", "LLaMA-style RMSNorm(4096) on [8192, 4096] (large: GPU benchmarks)", 8192, 4096,
             torch.float32, _module(lambda: _RMSNorm(4096), 8192, 4096)),
    ZooEntry("gpt2-tiny", "transformers GPT-2, 2 layers, hidden 64", 1, 16, torch.float32, _hf("gpt2")),
    ZooEntry("llama-tiny", "transformers Llama, 2 layers, hidden 64, GQA 4/2", 1, 16, torch.float32, _hf("llama")),
    ZooEntry("mistral-tiny", "transformers Mistral, 2 layers, hidden 64, GQA 4/2", 1, 16, torch.float32, _hf("mistral")),
    ZooEntry("qwen2-tiny", "transformers Qwen2, 2 layers, hidden 64, GQA 4/2", 1, 16, torch.float32, _hf("qwen2")),
    ZooEntry("gpt2-124m", "transformers GPT-2 124M config, 12 layers (meta: profile only)", 1, 1024, torch.float32,
             _hf_full("gpt2", 1024, torch.float32)),
    ZooEntry("llama2-7b", "transformers Llama-2-7B config, 32 layers (meta: profile only)", 1, 4096, torch.bfloat16,
             _hf_full("llama", 4096, torch.bfloat16)),
    ZooEntry("mistral-7b", "transformers Mistral-7B config, 32 layers, GQA 32/8 (meta: profile only)", 1, 4096,
             torch.bfloat16, _hf_full("mistral", 4096, torch.bfloat16)),
    ZooEntry("qwen2-7b", "transformers Qwen2-7B config, 28 layers, GQA 28/4 (meta: profile only)", 1, 4096,
             torch.bfloat16, _hf_full("qwen2", 4096, torch.bfloat16)),
    ZooEntry("bert-base", "transformers BERT-base config, 12 layers (meta: profile only)", 1, 512, torch.float32,
             _hf_full("bert", 512, torch.float32)),
    ZooEntry("bert-tiny", "transformers BERT, 2 layers, hidden 64", 1, 16, torch.float32, _hf("bert")),
]}


def get(name: str) -> ZooEntry:
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; built-in examples: {', '.join(ZOO)}") from None
