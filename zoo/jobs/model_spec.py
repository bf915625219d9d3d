"""The model a job builds from its config: ``model.*`` (name, tag, pretrained weights, overrides) sized for the data,
and the plain containers the jobs fingerprint."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import ConfigError
from ..training.data import DataBundle


def to_container(cfg: Any) -> dict:
    """A plain, resolved dict of a DictConfig (or a dict as is)."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def model_kwargs(model_cfg: Any, data: DataBundle, weights: bool = False) -> dict[str, Any]:
    """``create_model`` arguments: num_classes (classification) or vocab_size (LM) checked against the data.

    ``model.num_classes: null`` takes the data set's class count; a different explicit value is an error.
    For language models ``model.overrides.vocab_size`` defaults to the data's vocabulary (256 bytes, or the
    tokenizer's), except when `weights` are loaded: then the weights decide it (checked by :func:`check_vocab`).
    """
    overrides = dict(model_cfg.overrides or {})
    if data.task == "language_model":
        vocab = overrides.get("vocab_size", None if weights else data.num_classes)
        if vocab is not None:
            overrides["vocab_size"] = vocab
            if vocab < data.num_classes:
                raise ConfigError(f"model.overrides.vocab_size={vocab} is smaller than the data's vocabulary "
                                  f"({data.num_classes} tokens); remove the override or set it to {data.num_classes}.")
        return {"overrides": overrides, "num_classes": None}
    classes = model_cfg.num_classes
    if classes is not None and classes != data.num_classes:
        raise ConfigError(f"model.num_classes={classes} but the data set has {data.num_classes} classes; set "
                          f"model.num_classes={data.num_classes} or leave it null to take the data's count.")
    return {"overrides": overrides, "num_classes": data.num_classes}


def check_vocab(model: nn.Module, data: DataBundle, source: Any) -> None:
    """A language model's vocabulary must hold every token id of the data (its tokenizer's vocabulary)."""
    vocab = getattr(model, "vocab_size", None)
    if data.task == "language_model" and vocab is not None and vocab < data.num_classes:
        tokenizer = data.info.get("tokenizer", "bytes")
        name = getattr(model, "zoo_name", "the model")
        raise ConfigError(f"The tokenizer ({tokenizer}) has {data.num_classes} tokens, more than the vocabulary of "
                          f"{name} with weights {source} ({vocab}): its ids would not fit. Use the tokenizer the "
                          f"weights were trained with (data.tokenizer=...).")


def weights_arg(value: Any) -> bool | str:
    """A ``model.pretrained``/``checkpoint`` value as ``create_model(pretrained=...)`` takes it: False for none,
    True for the tag's weights, else a file or hub id (Hydra may give ``true`` as a string)."""
    if value in (None, "", False, "false", "False", "null"):
        return False
    if value in (True, "true", "True"):
        return True
    return str(value)


def model_name(model_cfg: Any) -> str:
    """The name ``create_model`` takes: ``model.name`` with ``model.tag`` (``mobilenetv2_140.ra_in1k``)."""
    return f"{model_cfg.name}.{model_cfg.tag}" if model_cfg.get("tag") else model_cfg.name


def model_tag(model_cfg: Any, weights: Any = None) -> str | None:
    """``model.tag``, else the tag the weights carry (``true``, a ``timm/<arch>.<tag>`` hub id, a depthzoo
    checkpoint's metadata): the weights' eval config is the one the data transforms must follow."""
    from ..weights.tags import source_tag

    if model_cfg.get("tag"):
        return model_cfg.tag
    return source_tag(model_cfg.name, weights_arg(model_cfg.pretrained if weights is None else weights))


def data_model_cfg(model_cfg: Any, weights: Any = None) -> dict[str, Any]:
    """The model config the data transforms follow: the eval config of the tag (:func:`model_tag`), timm's."""
    from ..weights.tags import pretrained_cfg

    return pretrained_cfg(model_cfg.name, model_tag(model_cfg, weights))


def build_model(model_cfg: Any, data: DataBundle, pretrained: Any = None) -> nn.Module:
    """The configured zoo model, sized for `data` (see :func:`model_kwargs`), with ``model.pretrained`` weights
    (or `pretrained` instead, when given)."""
    import zoo

    weights = weights_arg(model_cfg.pretrained if pretrained is None else pretrained)
    kwargs = model_kwargs(model_cfg, data, weights=weights is not False)
    model = zoo.create_model(model_name(model_cfg), pretrained=weights, num_classes=kwargs["num_classes"],
                             **kwargs["overrides"])
    check_vocab(model, data, weights)
    return model
