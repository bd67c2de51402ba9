"""``hf:ARCH[:key=value,...]``: any transformers architecture, built from its config class.

``AutoConfig.for_model(ARCH, **kw)`` with random weights (nothing downloaded), the model class
from transformers' Auto mappings (a causal LM's ``AutoModelForCausalLM``, an encoder-decoder's
``AutoModelForSeq2SeqLM``, else ``AutoModel``: encoders, vision and audio models), and inputs
made for the model's ``main_input_name`` (token ids, images, audio samples or features; an
encoder-decoder also gets decoder ids).

Note [small by default]: a config's defaults are its real model's sizes (a 7B decoder's hidden
4096, vocabulary 32000), too large to run on a CPU in a sweep. Each size field the config has
(``SMALL``: widths, layers, heads, feed-forward widths, vocabulary, positions, images) is set
small before the config is made, so derived fields (a head's width) follow; the user's
``key=value`` pairs override them. A model still over ``MAX_PARAMS`` parameters is refused
before its weights exist (a sweep of every architecture must not fill a CPU machine's
memory). ``real_size=True`` keeps the config's own sizes and builds the
model and its inputs on the meta device: captured, segmented and profiled, never run.
"""

from __future__ import annotations

import ast
from typing import Any

import torch

__all__ = ["HfSpecError", "SMALL", "architectures", "build", "parse"]

#: (Note [small by default]) field -> small value, set where the config has the field
SMALL: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "embedding_size", "word_embed_proj_dim",
                     "projection_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "attention_heads"), 4),
    "num_key_value_heads": 2,
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
                     "hidden_dim", "moe_intermediate_size", "shared_expert_intermediate_size"), 128),
    "head_dim": 16, "d_kv": 16, "rotary_dim": 8,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4,
    "vocab_size": 128,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions",
                     "n_ctx"), 64),
    "image_size": 32, "num_mel_bins": 16, "window_size": 4,
    # a mixture of experts routes to fewer experts than it has, in one group
    "num_experts_per_tok": 2, "moe_topk": 2, "n_group": 1, "topk_group": 1,
}
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
              "cls_token_id", "mask_token_id")

BATCH, SEQ, DECODER_SEQ = 2, 16, 8
#: (Note [small by default]) a model that is still larger than this at the small sizes (a size
#: field the table does not name) is refused before its weights are made: built on the meta
#: device and counted first, it costs no memory
MAX_PARAMS = 20_000_000


class HfSpecError(ValueError):
    """An ``hf:`` target transformers cannot build (an unknown architecture, a bad key)."""


def parse(spec: str) -> tuple[str, dict[str, Any]]:
    """``hf:gpt2:n_layer=4,use_cache=False`` -> ("gpt2", {"n_layer": 4, "use_cache": False})."""
    body = spec.removeprefix("hf:")
    arch, _, rest = body.partition(":")
    if not arch:
        raise HfSpecError(f"{spec!r}: no architecture after 'hf:' (e.g. hf:gpt2, hf:bert:num_hidden_layers=4)")
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise HfSpecError(f"{spec!r}: {item!r} is not key=value")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value  # a bare word: a string (hidden_act=gelu)
    return arch, overrides


def architectures() -> list[str]:
    """Every model type transformers ships a model class for (``AutoModel``'s mapping), sorted."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(MODEL_MAPPING_NAMES)


def _small(default: Any) -> dict[str, Any]:
    """The small values of ``default``'s size fields (Note [small by default]); a nested config
    (a multimodal model's ``text_config``, ``vision_config``) made small the same way, whole."""
    from transformers import PretrainedConfig

    fields = set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
    small = {k: v for k, v in SMALL.items() if k in fields and isinstance(getattr(default, k, None), int)
             and not isinstance(getattr(default, k, None), bool)}
    for k in ("hidden_size", "d_model", "n_embd"):  # keep a head's width a divisor of the width
        if k in small and "head_dim" in fields and getattr(default, "head_dim", None) is None:
            small.pop("head_dim", None)
    for k in _TOKEN_IDS:  # special tokens inside the small vocabulary
        if isinstance(getattr(default, k, None), int) and getattr(default, k) >= small.get("vocab_size", 1 << 62):
            small[k] = 0
    for k in ("num_heads", "num_attention_heads"):  # per stage (swin): 2, 4, 8, ... for a width that doubles
        if isinstance(getattr(default, k, None), (list, tuple)):
            small[k] = [2 << i for i in range(len(getattr(default, k)))]
    layers = getattr(default, "num_hidden_layers", None)
    if isinstance(layers, int) and "num_hidden_layers" in small:  # per-layer lists (layer_types) as long as the layers
        for k, v in default.to_dict().items():
            if isinstance(v, list) and len(v) == layers and k not in small:
                small[k] = v[:small["num_hidden_layers"]]
    if isinstance(getattr(default, "depths", None), (list, tuple)):
        small["depths"] = [1] * len(default.depths)
    patch = getattr(default, "patch_size", None)
    if isinstance(patch, int) and "image_size" in small:
        small["image_size"] = max(32, 4 * patch)
    for k, sub in vars(default).items():
        if isinstance(sub, PretrainedConfig):
            small[k] = {**sub.to_dict(), **_small(sub)}
    aliases = getattr(default, "attribute_map", {})
    return {aliases.get(k, k): v for k, v in small.items()}


def _config(arch: str, overrides: dict[str, Any], real_size: bool) -> Any:
    from transformers import AutoConfig

    try:
        default = AutoConfig.for_model(arch)
    except ValueError as e:
        raise HfSpecError(f"hf:{arch}: {str(e).splitlines()[0]}") from None
    small = {} if real_size else _small(default)
    # one name per field: a config's aliases (gpt2's num_hidden_layers is its n_layer) to the field,
    # so that the user's n_layer=1 replaces the small default whichever name either used
    aliases = getattr(default, "attribute_map", {})
    # a mixture of experts on its loop over experts: the grouped-matmul kernel transformers
    # picks by default takes bfloat16 only on a CPU
    kwargs: dict[str, Any] = {"experts_implementation": "eager", **small}
    kwargs.update({aliases.get(k, k): v for k, v in overrides.items()})
    try:
        config = AutoConfig.for_model(arch, **kwargs)
    except (TypeError, ValueError, AssertionError) as e:
        raise HfSpecError(f"hf:{arch}: its config refuses {sorted(kwargs)}: {e}") from None
    if hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def _model_class(arch: str, config: Any) -> Any:
    import transformers
    from transformers.models.auto import modeling_auto as m

    if getattr(config, "is_encoder_decoder", False) and arch in m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return transformers.AutoModelForSeq2SeqLM
    # (an encoder with a causal-LM variant, bert's, is an encoder: its masked-LM mapping says so)
    if (not getattr(config, "is_encoder_decoder", False) and arch in m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and arch not in m.MODEL_FOR_MASKED_LM_MAPPING_NAMES):
        return transformers.AutoModelForCausalLM
    return transformers.AutoModel


class _ByName(torch.nn.Module):
    """The model called with keyword inputs, taking them by position (the capture passes them so)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(**dict(zip(self.names, inputs)))


def _inputs(model: Any, config: Any, device: str, real_size: bool) -> tuple[tuple[str, ...], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    vocab = int(getattr(config, "vocab_size", None) or 128)
    seq = SEQ
    if real_size:
        seq = min(512, int(getattr(config, "max_position_embeddings", None) or 512))

    def ids(length: int) -> torch.Tensor:
        if device == "meta":
            return torch.zeros(BATCH, length, dtype=torch.long, device="meta")
        return torch.randint(0, vocab, (BATCH, length), generator=g)

    def floats(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, device="meta") if device == "meta" else torch.randn(*shape, generator=g)

    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = getattr(config, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        first = floats(BATCH, int(getattr(config, "num_channels", 3)), int(size), int(size))
    elif main == "input_values":
        first = floats(BATCH, 4000)
    elif main == "input_features":
        frames = 2 * int(getattr(config, "max_source_positions", 32) or 32)
        first = floats(BATCH, int(getattr(config, "num_mel_bins", 16) or 16), frames)
    elif main == "input_ids":
        first = ids(seq)
    else:
        raise HfSpecError(f"its model takes {main!r} first, which hf: targets do not make")
    if getattr(config, "is_encoder_decoder", False):
        return (main, "decoder_input_ids"), [first, ids(DECODER_SEQ)]
    return (main,), [first]


def build(spec: str, real_size: bool = False, max_params: int = MAX_PARAMS,
          ) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The model of an ``hf:`` target and its example inputs (Note [small by default])."""
    arch, overrides = parse(spec)
    config = _config(arch, overrides, real_size)
    cls = _model_class(arch, config)
    torch.manual_seed(0)
    device = "meta" if real_size else "cpu"
    try:
        with torch.device("meta"):  # (its size first: Note [small by default]'s guard)
            model = cls.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        if not real_size and params > max_params:
            raise HfSpecError(f"hf:{arch}: {params / 1e6:.1f}M parameters at the small sizes, over the "
                              f"{max_params / 1e6:.0f}M that hf: targets build on the CPU (a size field "
                              "the shrinking does not know: set it with key=value, or use --real-size)")
        if device != "meta":
            with torch.device(device):
                model = cls.from_config(config)
    except HfSpecError:
        raise
    except ValueError as e:
        raise HfSpecError(f"hf:{arch}: {cls.__name__} has no model for it: {str(e).splitlines()[0]}") from None
    model = model.eval()
    names, inputs = _inputs(model, config, device, real_size)
    return _ByName(model, names).eval(), inputs
