"""The models the compiled-model benchmarks run (perf/compiled.py, perf/before_after.py): the
zoo's runnable entries and transformer-family models the project was never tuned on.

Imports are absolute and light (torch, transformers, ``perf.zoo``) so that an older checkout of
the project can load this file by path and run the same models (perf/before_after.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from perf import zoo

__all__ = ["HELD_OUT", "MODELS"]

Factory = Callable[[], tuple[torch.nn.Module | Callable[..., Any], list[Any]]]


def _hf(config: str, model: str, vision: bool = False, **cfg: Any) -> Factory:
    """A transformers model from a tiny config (random weights, no download): batch 2, seq 32."""
    def factory() -> tuple[Any, list[Any]]:
        import transformers

        torch.manual_seed(0)
        conf = getattr(transformers, config)(**cfg)
        if hasattr(conf, "use_cache"):
            conf.use_cache = False
        m = getattr(transformers, model)(conf).eval()
        g = torch.Generator().manual_seed(0)
        if vision:
            return m, [torch.randn(2, 3, cfg["image_size"], cfg["image_size"], generator=g)]
        return m, [torch.randint(0, cfg.get("vocab_size", 128), (2, 32), generator=g)]
    return factory


_DEC = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64)

#: transformer-family models the segmenter, the kernels and the runtime were never tuned on
HELD_OUT: dict[str, Factory] = {
    "gpt-neox": _hf("GPTNeoXConfig", "GPTNeoXModel", **_DEC),
    "phi": _hf("PhiConfig", "PhiModel", **_DEC),
    "gemma": _hf("GemmaConfig", "GemmaModel", head_dim=16, num_key_value_heads=2, **_DEC),
    "opt": _hf("OPTConfig", "OPTModel", vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               ffn_dim=128, max_position_embeddings=64, word_embed_proj_dim=64),
    "bloom": _hf("BloomConfig", "BloomModel", vocab_size=128, hidden_size=64, n_layer=2, n_head=4),
    "falcon": _hf("FalconConfig", "FalconModel", vocab_size=128, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4),
    "roberta": _hf("RobertaConfig", "RobertaModel", **_DEC),
    "distilbert": _hf("DistilBertConfig", "DistilBertModel", vocab_size=128, dim=64, n_layers=2, n_heads=4,
                      hidden_dim=128, max_position_embeddings=64),
    "vit": _hf("ViTConfig", "ViTModel", vision=True, image_size=32, patch_size=8, hidden_size=64,
               num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    "gptj": _hf("GPTJConfig", "GPTJModel", vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                n_positions=64, bos_token_id=1, eos_token_id=2),
    "electra": _hf("ElectraConfig", "ElectraModel", vocab_size=128, embedding_size=64, hidden_size=64,
                   num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64),
    "albert": _hf("AlbertConfig", "AlbertModel", vocab_size=128, embedding_size=32, hidden_size=64,
                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64),
    "t5-encoder": _hf("T5Config", "T5EncoderModel", vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                      num_heads=4),
    "bart": _hf("BartConfig", "BartModel", vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                max_position_embeddings=64),
    "swin": _hf("SwinConfig", "SwinModel", vision=True, image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                num_heads=[2, 4], window_size=4),
    "convnext": _hf("ConvNextConfig", "ConvNextModel", vision=True, image_size=32, num_channels=3,
                    hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    "resnet": _hf("ResNetConfig", "ResNetModel", vision=True, image_size=32, embedding_size=16,
                  hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
    "mobilenet-v2": _hf("MobileNetV2Config", "MobileNetV2Model", vision=True, image_size=32, depth_multiplier=0.35),
}


def _runnable_zoo() -> dict[str, Factory]:
    """The zoo's entries that run here (real sizes live on the meta device: profiled, never run)."""
    return {name: e.factory for name, e in zoo.ZOO.items() if "meta" not in e.description}


#: every model the bench knows: the zoo's runnable entries, then the held-out ones
MODELS: dict[str, Factory] = {**_runnable_zoo(), **HELD_OUT}
