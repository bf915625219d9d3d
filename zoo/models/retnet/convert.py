"""Published RetNet checkpoints both ways: flash-linear-attention's model folders (config.json + safetensors, as
fla-hub/retnet-1.3B-100B) and torchscale's RetNetDecoder state dicts become RetNet options plus our keys
(:func:`read_foreign`), and a RetNet becomes an fla folder that transformers loads (:func:`fla_form`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .config import RETNET_SIZES, SHAPE_KEYS
from .layers import MultiScaleRetention
from .ops import (
    decay_logs,
    rotary_frequencies,
)


def fla_options(config: dict[str, Any]) -> dict[str, Any]:
    """RetNet options equal to a flash-linear-attention RetNet ``config.json``; options we do not support are named
    (WeightsError) instead of being loaded into a different network."""
    from ...errors import WeightsError

    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_heads") if k not in config]
    if missing:
        raise WeightsError(f"This flash-linear-attention config.json lacks {', '.join(missing)}: it does not describe "
                           f"a RetNet (fla writes these keys in every RetNetConfig).")
    heads = int(config["num_heads"])
    unsupported = []
    checks = [("model_type", "retnet"), ("feature_map", None), ("use_short_conv", False), ("use_output_gate", True),
              ("hidden_act", "swish"), ("expand_k", 1), ("attnres_block_size", None), ("attn", None)]
    for key, supported in checks:
        value = config.get(key, supported)
        if value != supported and not (key == "expand_k" and float(value) == 1.0):
            unsupported.append(f"{key}={value!r} (supported: {supported!r})")
    if config.get("num_kv_heads") not in (None, heads):
        unsupported.append(f"num_kv_heads={config['num_kv_heads']} (grouped keys; supported: null or num_heads)")
    if unsupported:
        raise WeightsError(f"This flash-linear-attention config has options the zoo RetNet does not support: "
                           f"{'; '.join(unsupported)}.")
    dim = int(config["hidden_size"])
    ffn_dim = config.get("intermediate_size")
    if ffn_dim is None:  # fla's GatedMLP: 2/3 * hidden_ratio * hidden, rounded up to a multiple of 256
        ratio = config.get("hidden_ratio", 2)  # RetNetConfig's default is 2; GatedMLP takes None as 4
        ffn_dim = int(dim * (4 if ratio is None else ratio) * 2 / 3)
        ffn_dim = 256 * ((ffn_dim + 255) // 256)
    return {"vocab_size": int(config.get("vocab_size", 32000)), "dim": dim,
            "depth": int(config["num_hidden_layers"]), "heads": heads, "ffn_dim": int(ffn_dim),
            "value_factor": float(config.get("expand_v", 2.0)),
            "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
            "norm_eps": float(config.get("norm_eps", 1e-6)), "rope": "neox",
            "rope_theta": float(config.get("rope_theta", 10000.0)),
            "head_norm_affine": bool(config.get("elementwise_affine", True)), "decay": "torchscale"}


def rename_keys(state: dict[str, torch.Tensor], layer_prefix: str, layer_renames: dict[str, str],
                renames: dict[str, str]) -> dict[str, torch.Tensor]:
    """Another project's keys -> ours: ``<layer_prefix><i>.<rest>`` -> ``blocks.<i>.<rest>`` with the first matching
    prefix of `rest` renamed by `layer_renames`; other keys renamed by `renames` (or kept)."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.startswith(layer_prefix):
            index, rest = key.removeprefix(layer_prefix).split(".", 1)
            old = next((o for o in layer_renames if rest.startswith(o)), None)
            out[f"blocks.{index}.{layer_renames[old] + rest[len(old):] if old else rest}"] = tensor
        else:
            out[renames.get(key, key)] = tensor
    return out


def fla_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """flash-linear-attention RetNet keys -> ours (an older fused ``mlp.gate_proj`` of twice the width is split)."""
    renames = {"attn_norm": "retention.norm", "attn.o_proj": "retention.out_proj",
               "attn.g_norm_swish_gate.weight": "retention.head_norm_weight",
               "attn.g_norm.weight": "retention.head_norm_weight", "attn.": "retention.", "mlp_norm": "ffn.norm",
               "mlp.": "ffn."}
    out = rename_keys(state, "model.layers.", renames,
                      {"model.embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight"})
    for key in [k for k in out if k.endswith("ffn.gate_proj.weight")]:
        up = key.replace("gate_proj", "up_proj")
        if up not in out:  # fused gate and up projections: first half gate, second half up
            out[key], out[up] = out[key].chunk(2, dim=0)
    return out


def torchscale_options(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """RetNet options of a torchscale ``RetNetDecoder`` state dict (sizes from the tensors; its rotary angles and
    decays are checked against ours). A state dict does not record every option: torchscale's defaults are assumed
    for those (``no_scale_embedding=True``, no ``deepnorm``); ``layernorm_embedding`` shows in its keys and is refused.
    An output projection equal to the embedding was tied (``share_decoder_input_output_embed``) and stays tied."""
    from ...errors import WeightsError

    if "layernorm_embedding.weight" in state:
        raise WeightsError("This torchscale checkpoint was trained with layernorm_embedding=True, which the zoo RetNet "
                           "does not support (a LayerNorm after the embedding).")

    dim = state["embed_tokens.weight"].shape[1]
    heads = state["retnet_rel_pos.decay"].shape[0] if "retnet_rel_pos.decay" in state else None
    if heads is None:
        raise WeightsError("This torchscale state dict has no retnet_rel_pos.decay, so its number of heads is unknown.")
    options = {"vocab_size": state["embed_tokens.weight"].shape[0], "dim": dim,
               "depth": 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers.")), "heads": int(heads),
               "ffn_dim": state["layers.0.ffn.fc1.weight"].shape[0],
               "value_factor": state["layers.0.retention.v_proj.weight"].shape[0] / dim,
               "tie_embeddings": "output_projection.weight" not in state or torch.equal(
                   state["output_projection.weight"], state["embed_tokens.weight"]),
               "rope": "torchscale", "decay": "torchscale"}
    decay = torch.tensor(decay_logs(options["heads"], "torchscale"), dtype=torch.float32)
    if not torch.allclose(state["retnet_rel_pos.decay"].float(), decay, atol=1e-6):
        raise WeightsError("This torchscale checkpoint's decays (retnet_rel_pos.decay) are not 1 - 2^(-5-h), the "
                           "only schedule torchscale writes that the zoo RetNet supports.")
    angle = rotary_frequencies(dim // options["heads"]).abs().float()
    if "retnet_rel_pos.angle" in state and not torch.allclose(state["retnet_rel_pos.angle"].float(), angle, rtol=1e-5):
        raise WeightsError("This torchscale checkpoint's rotary angles (retnet_rel_pos.angle) are not 1/10000^"
                           "linspace(0, 1, head_dim/2), the only ones the zoo RetNet supports.")
    return options


def torchscale_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchscale RetNetDecoder keys -> ours: its GLU ``fc2(swish(fc1 x) * gate x)`` is our gate/up/down."""
    renames = {"retention_layer_norm": "retention.norm", "final_layer_norm": "ffn.norm", "ffn.fc1": "ffn.gate_proj",
               "ffn.gate": "ffn.up_proj", "ffn.fc2": "ffn.down_proj"}
    kept = {k: v for k, v in state.items() if not k.startswith("retnet_rel_pos.")}  # fixed buffers, checked above
    return rename_keys(kept, "layers.", renames, {"embed_tokens.weight": "embed.weight",
                                                  "output_projection.weight": "lm_head.weight",
                                                  "layer_norm.weight": "norm.weight"})


def foreign_format(state: dict[str, torch.Tensor], config: dict[str, Any] | None) -> str | None:
    """``fla`` or ``torchscale`` when the weights are in that format, else None (ours, or not a RetNet)."""
    if "model.embeddings.weight" in state or (config or {}).get("model_type") == "retnet":
        return "fla"
    if "embed_tokens.weight" in state and any(k.startswith("layers.0.retention.") for k in state):
        return "torchscale"
    return None


def read_foreign(arch: str, state: dict[str, torch.Tensor], config: dict[str, Any] | None,
                 overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """(options, our state dict) of flash-linear-attention or torchscale weights for the registered `arch`, or None
    when they are in neither format. Their sizes must be `arch`'s (or given as overrides); else the message names
    the registered size that fits."""
    from ...errors import WeightsError

    fmt = foreign_format(state, config)
    if fmt is None:
        return None
    if fmt == "fla":
        if config is None:
            raise WeightsError("flash-linear-attention weights need their config.json: pass the model folder (or hub "
                               "id) that holds config.json and the safetensors, not the weight file alone.")
        options, converted = fla_options(config), fla_state_dict(state)
    else:
        options, converted = torchscale_options(state), torchscale_state_dict(state)
    expected = {**{k: v for k, v in RETNET_SIZES[arch].items() if k in SHAPE_KEYS}, **overrides}
    found = {k: options[k] for k in SHAPE_KEYS}
    if any(expected.get(k) != v for k, v in found.items()):
        fits = [n for n, size in RETNET_SIZES.items() if all(size[k] == v for k, v in found.items())]
        hint = (f"use model {fits[0]}" if fits else
                f"build it with {', '.join(f'{k}={v}' for k, v in found.items())} as model options")
        raise WeightsError(f"These {fmt} weights are a RetNet of {', '.join(f'{k} {v}' for k, v in found.items())}, "
                           f"not {arch} ({', '.join(f'{k} {expected.get(k)}' for k in SHAPE_KEYS)}): {hint}.")
    return options, converted


def fla_form(model: nn.Module) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, state dict) of `model` as a flash-linear-attention RetNet (``RetNetForCausalLM``), the inverse
    of :func:`fla_options` and :func:`fla_state_dict`: what ``zoo.export(model, folder, format="hf")`` writes.

    A layer whose retention and FFN sub-layers were both removed is left out (fla numbers the rest); fla's layers
    always have both, so a plan that removed one of them, and options fla's RetNet does not have (torchscale's
    interleaved rotary, the paper's linspace decays), are refused with what to do instead. fla's fused kernels are
    switched off in the config (``fuse_norm``, ``fuse_swiglu``, ``fuse_cross_entropy``: false, so the head norm's
    key is ``g_norm``): the same numbers from fla's unfused modules."""
    from ...errors import ExportError

    first = next((b.retention for b in model.blocks if isinstance(b.retention, MultiScaleRetention)), None)
    problems = []
    gone = [(isinstance(b.retention, nn.Identity), isinstance(b.ffn, nn.Identity)) for b in model.blocks]
    half = [f"blocks.{i}.{'retention' if retention else 'ffn'}" for i, (retention, ffn) in enumerate(gone)
            if retention != ffn]
    if half:
        problems.append(f"the plan removed single sub-layers ({', '.join(half)}), and fla's RetNet layers always have "
                        f"both: prune whole layers (both blocks.i.retention and blocks.i.ffn), or export this plan as "
                        f"ONNX / torch.export or a depthzoo checkpoint")
    if first is None:
        problems.append("every retention sub-layer was removed")
    elif first.rope != "neox":
        problems.append(f"rope={first.rope!r} (torchscale's interleaved rotary); fla's RetNet rotates halves: build "
                        f"the model with model.overrides.rope=neox (as models loaded from fla checkpoints are)")
    elif list(first.log_decays) != decay_logs(model.heads, "torchscale"):
        problems.append("decay='linspace' (the paper's experiments); fla's RetNet has torchscale's decays")
    elif first.rope_theta != 10000.0:
        problems.append(f"rope_theta={first.rope_theta:g}; fla's RetNet rotates with base 10000")
    if problems:
        raise ExportError(f"This RetNet cannot be written as a flash-linear-attention model: {'; '.join(problems)}.")
    kept = [i for i, b in enumerate(model.blocks) if not isinstance(b.retention, nn.Identity)]
    config = {"model_type": "retnet", "architectures": ["RetNetForCausalLM"], "hidden_size": model.dim,
              "num_hidden_layers": len(kept), "num_heads": model.heads, "num_kv_heads": None, "expand_k": 1,
              "expand_v": model.value_dim / model.dim, "intermediate_size": model.ffn_dim, "hidden_act": "swish",
              "use_short_conv": False, "use_output_gate": True, "feature_map": None, "attn": None,
              "elementwise_affine": first.head_norm_weight is not None, "norm_eps": model.norm.eps,
              "vocab_size": model.vocab_size, "tie_word_embeddings": model.tie_embeddings,
              "max_position_embeddings": int(getattr(model, "default_cfg", {}).get("input_size", (2048,))[0]),
              "fuse_norm": False, "fuse_swiglu": False, "fuse_cross_entropy": False,
              "torch_dtype": str(model.embed.weight.dtype).removeprefix("torch.")}
    sub = {"retention.norm": "attn_norm", "retention.out_proj": "o_proj", "retention.head_norm_weight": "g_norm.weight",
           "retention.": "", "ffn.norm": "mlp_norm", "ffn.": "mlp."}
    state: dict[str, torch.Tensor] = {"model.embeddings.weight": model.embed.weight,
                                      "model.norm.weight": model.norm.weight}
    for new, old in enumerate(kept):
        for key, tensor in model.blocks[old].state_dict().items():
            prefix = next(o for o in sub if key.startswith(o))
            rest = key[len(prefix):]
            name = sub[prefix] + rest if prefix != "retention." else rest
            if prefix.startswith("retention") and prefix != "retention.norm":
                name = "attn." + name
            state[f"model.layers.{new}.{name}"] = tensor
    if not model.tie_embeddings:
        state["lm_head.weight"] = model.lm_head.weight
    return config, {k: v.detach().contiguous() for k, v in state.items()}

