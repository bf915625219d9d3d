"""Resolve and load weights: local files (safetensors, pickled state dicts, our checkpoints) and HF hub ids.

Resolution follows timm: an explicit file wins, then a hub id, then (``pretrained=True``) the model's
default published tag. Everything is checked against the model before loading, so a mismatch never
leaves a half-loaded model.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import WeightsError
from .checkpoint import read_checkpoint_meta, tied_aliases

_logger = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)
_WRAPPER_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")

__all__ = ["WeightsError", "WeightSource", "resolve_source", "load_into", "read_state_dict"]


@dataclass
class WeightSource:
    """Resolved weights: where they came from, their tensors, depthzoo metadata if they have any, and the
    ``config.json`` beside them (a Hugging Face model folder or hub repo, e.g. flash-linear-attention's)."""

    path: Path
    origin: str
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any] | None
    config: dict[str, Any] | None = None


INDEX_FILE = "model.safetensors.index.json"


SHARD = re.compile(r".+-\d+-of-\d+\.safetensors$")  # model-00001-of-00003.safetensors


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a model folder: the shards its index names, model.safetensors, the shards of one sharded
    set, the folder's only weight file, or pytorch_model.bin. Several other weight files (e.g. a run's best and
    last checkpoints) are ambiguous: refused, naming them."""
    if (folder / INDEX_FILE).is_file():
        try:
            index = json.loads((folder / INDEX_FILE).read_text())
        except ValueError as exc:
            raise WeightsError(f"{folder / INDEX_FILE} is not JSON ({exc}).") from None
        return [folder / name for name in sorted(set(index.get("weight_map", {}).values()))]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    tensors = sorted(folder.glob("*.safetensors"))
    if tensors and all(SHARD.match(p.name) for p in tensors):
        return tensors
    candidates = tensors or sorted(p for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if (folder / "pytorch_model.bin").is_file() and not tensors:
        return [folder / "pytorch_model.bin"]
    if len(candidates) == 1:
        return candidates
    if candidates:
        raise WeightsError(f"{folder} holds several weight files ({', '.join(p.name for p in candidates[:5])}) and "
                           f"no {INDEX_FILE} saying they are shards of one model: name the file you mean.")
    raise WeightsError(f"{folder} holds no weights: expected {INDEX_FILE}, model.safetensors, a sharded set or "
                       f"pytorch_model.bin (with config.json for a Hugging Face model folder).")


def read_folder(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """All tensors of a model folder (shards merged) and its config.json (None when it has none)."""
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(folder):
        state.update(read_state_dict(file))
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else None
    except ValueError as exc:
        raise WeightsError(f"{config_file} is not JSON ({exc}).") from None
    return state, config


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weight file into a flat state dict (safetensors, or a pickled dict with weights_only=True)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"Weight file {path} does not exist. Give an existing {'/'.join(WEIGHT_SUFFIXES)} file.")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"(unsupported GLOBAL \S+|Unsupported global: \S+[^\n]*)", str(exc))
        what = found.group(1).rstrip(".") if found else "objects other than tensors"
        raise WeightsError(
            f"{path} is refused for safety: it is a pickle that holds Python objects besides tensors ({what}), "
            f"and loading those could run arbitrary code. Only plain state dicts (tensors) are loaded; convert the "
            f"file to .safetensors where you trust its source."
        ) from None
    except Exception as exc:  # noqa: BLE001 - any decode failure means the same thing to the user
        raise WeightsError(
            f"Cannot read weight file {path}: {type(exc).__name__}: {exc}. The file is unreadable, truncated "
            f"or not a weight file; allowed are .safetensors and pickled state dicts ({', '.join(PICKLE_SUFFIXES)})."
        ) from exc
    for key in _WRAPPER_KEYS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise WeightsError(f"{path} does not hold a state dict (a mapping of names to tensors).")
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}


HUB_FILES = ("model.safetensors", INDEX_FILE, "pytorch_model.bin")
HUB_EXTRAS = ("config.json",)  # fetched beside the weights where the repo has them


def download_command(hub_id: str) -> str:
    """The shell command that fetches `hub_id` with the installed huggingface_hub (``hf`` from 0.34 on)."""
    import huggingface_hub

    major, minor = (int(p) for p in re.findall(r"\d+", huggingface_hub.__version__)[:2])
    return f"hf download {hub_id}" if (major, minor) >= (0, 34) else f"huggingface-cli download {hub_id}"


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub's host resolves and accepts a connection (a quick check before hf_hub_download's retries)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _fetch_rest(hub_id: str, weights: Path, cached: bool) -> Path:
    """Fetch the files that go with a repo's weights (config.json; the shards of a sharded index) into the same
    snapshot folder; returns the folder."""
    from huggingface_hub import hf_hub_download

    wanted = list(HUB_EXTRAS)
    if weights.name == INDEX_FILE:
        wanted += sorted(set(json.loads(weights.read_text()).get("weight_map", {}).values()))
    for filename in wanted:
        try:
            hf_hub_download(hub_id, filename, local_files_only=cached)
        except Exception as exc:  # noqa: BLE001 - a missing config is fine; a missing shard is reported when read
            if filename not in HUB_EXTRAS:
                raise WeightsError(f"Shard {filename} of hub id {hub_id!r} is not available ({type(exc).__name__}); "
                                   f"download the whole repo with `{download_command(hub_id)}`.") from None
    return weights.parent


def _download_from_hub(hub_id: str) -> Path:
    """A repo's snapshot folder (weights and config.json) from the local Hugging Face cache, else downloaded; fails
    at once, with the command that downloads it, when the Hub cannot be reached (offline, or HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError

    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    for filename in HUB_FILES:
        try:
            return _fetch_rest(hub_id, Path(hf_hub_download(hub_id, filename, local_files_only=True)), cached=True)
        except WeightsError:
            if offline:
                raise
            break  # cached in part (an index without all its shards): complete it from the Hub below
        except Exception:  # noqa: BLE001 - not in the cache (the error type varies by version)
            continue
    if offline or not _hub_reachable():
        why = "HF_HUB_OFFLINE=1 is set" if offline else "the Hub cannot be reached from here"
        raise WeightsError(
            f"Hub id {hub_id!r} is not in the local Hugging Face cache and {why}, so it cannot be checked or "
            f"downloaded now. Check the spelling; download it where there is network with `{download_command(hub_id)}`"
            f" (same HF_HOME), or pass a local file: zoo.create_model(name, pretrained='path/to/model.safetensors')."
        )
    errors = []
    for filename in HUB_FILES:
        try:
            return _fetch_rest(hub_id, Path(hf_hub_download(hub_id, filename)), cached=False)
        except RepositoryNotFoundError:
            raise WeightsError(f"Hub id {hub_id!r} does not exist on the Hugging Face Hub (or is private). Check "
                               f"the spelling, e.g. 'timm/mobilenetv2_100.ra_in1k'.") from None
        except EntryNotFoundError:
            errors.append(f"{filename}: not in the repo")
        except Exception as exc:  # noqa: BLE001 - network errors vary by version; all end the same way
            errors.append(f"{filename}: {type(exc).__name__}")
    raise WeightsError(f"Could not download weights for hub id {hub_id!r} ({'; '.join(errors)}). Download them with "
                       f"`{download_command(hub_id)}` or pass a local file.")


def is_local(pretrained: str | Path) -> bool:
    """Whether a ``pretrained`` string names a local file or folder (an existing path, a weight-file suffix, a path
    starting with ``/``, ``~`` or ``.``, or no ``/``) rather than a hub id (``owner/name``)."""
    text = str(pretrained)
    return (Path(text).expanduser().exists() or text.endswith(WEIGHT_SUFFIXES) or "/" not in text
            or text.startswith(("/", "~", ".")))


def hub_name(pretrained: str) -> str:
    """A hub id as huggingface_hub takes it: no ``hf-hub:`` prefix, no trailing slash."""
    return str(pretrained).removeprefix("hf-hub:").rstrip("/")


def check_source(pretrained: bool | str | Path | None) -> None:
    """Before any work: a ``pretrained`` local file or model folder must exist (a hub id is resolved when the model
    is built)."""
    if pretrained in (None, False, True, "", "false", "False") or not is_local(pretrained):
        return
    local = Path(str(pretrained)).expanduser()
    if local.is_dir():
        weight_files(local)
        return
    if not local.is_file():
        raise WeightsError(f"Weight file or folder {pretrained} does not exist. Give an existing "
                           f"{'/'.join(WEIGHT_SUFFIXES)} file, a hub id such as 'timm/mobilenetv2_100.ra_in1k', "
                           f"true (the default tag) or false.")


def resolve_source(pretrained: str | Path) -> WeightSource:
    """Turn a local file or a hub id (``hf-hub:`` prefix optional) into loaded tensors (see module docstring)."""
    text = str(pretrained)
    local = Path(text).expanduser()
    if is_local(text):
        path, origin = local, str(local)
    else:
        hub_id = hub_name(text)
        path, origin = _download_from_hub(hub_id), f"hf-hub:{hub_id}"
    if path.is_dir():
        state, config = read_folder(path)
        files = weight_files(path)
        meta = _meta(files[0]) if len(files) == 1 else None
        return WeightSource(path=path, origin=origin, state_dict=state, meta=meta, config=config)
    return WeightSource(path=path, origin=origin, state_dict=read_state_dict(path), meta=_meta(path))


def _meta(path: Path) -> dict[str, Any] | None:
    """depthzoo metadata of a .safetensors file (None for other files, and for files without it)."""
    if path.suffix != ".safetensors" or not path.is_file():
        return None
    try:
        return read_checkpoint_meta(path)
    except Exception:  # noqa: BLE001 - unreadable files are reported by read_state_dict
        return None


def _classifier_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the classifier named in the model's default_cfg (e.g. ``head.fc``)."""
    prefix = model.default_cfg.get("classifier")
    if not prefix:
        return []
    return [k for k in model.state_dict() if k.startswith(prefix + ".")]


def closest_architectures(state: dict[str, torch.Tensor], limit: int = 3) -> list[str]:
    """Registered models whose weights best match `state` (keys and shapes, the classifier aside): exact fits
    first, then by the share of tensors that fit. Built on the meta device (no memory, no weights)."""
    from ..models.registry import build_model, get_entry, list_models

    shapes = {k: tuple(v.shape) for k, v in state.items()}
    scored = []
    for name in list_models():
        if get_entry(name).task != "classification" and not any("embed" in k for k in shapes):
            continue
        try:
            with torch.device("meta"):
                model = build_model(name)
        except Exception:  # noqa: BLE001 - a model that needs options is simply not suggested
            continue
        head = model.default_cfg.get("classifier") or "\0"
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith(head + ".")}
        given = {k: v for k, v in shapes.items() if not k.startswith(head + ".")}
        fit = sum(1 for k, v in expected.items() if given.get(k) == v)
        scored.append((fit / max(len(expected), len(given), 1), name))
    scored.sort(reverse=True)
    return [name for score, name in scored[:limit] if score > 0.5]


def _format_mismatch(path: Path, missing: list[str], unexpected: list[str], shapes: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s), first: {', '.join(missing[:5])}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s), first: {', '.join(unexpected[:5])}")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatch(es), first: {'; '.join(shapes[:5])}")
    return f"Weights in {path} do not fit this architecture: " + "; ".join(parts) + "."


def load_into(model: nn.Module, source: WeightSource) -> nn.Module:
    """Check `source` against `model` (keys and shapes) and load it; re-initialise a mismatched classifier."""
    state = dict(source.state_dict)
    expected = model.state_dict()
    for alias, key in tied_aliases(model).items():
        if alias not in state and key in state:
            state[alias] = state[key]
    head_keys = _classifier_keys(model)
    head_differs = any(k in state and state[k].shape != expected[k].shape for k in head_keys) or (
        head_keys and not any(k in state for k in head_keys)
    )
    if head_differs:
        prefix = model.default_cfg.get("classifier")
        for key in list(state):
            if key.startswith(prefix + "."):
                state.pop(key)
        expected = {k: v for k, v in expected.items() if k not in head_keys}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    if missing or unexpected or shapes:
        own = getattr(model, "zoo_name", None)
        closest = [name for name in closest_architectures(source.state_dict) if name != own]
        hint = (f" The weights fit {', '.join(closest)} best: use that model name." if closest else
                f" No other registered model fits them better than {own or 'this one'}: the file is of this family "
                f"but not this exact architecture (or was saved with other model options).")
        raise WeightsError(_format_mismatch(source.path, missing, unexpected, shapes) + hint)
    if head_differs:
        _logger.warning("Classifier %s re-initialised: %s has a head for another number of classes than "
                        "num_classes=%s.", model.default_cfg.get("classifier"), source.origin,
                        getattr(model, "num_classes", "?"))
    model.load_state_dict(state, strict=not head_differs)
    model.pretrained_source = source.origin
    model.pretrained_head_reset = bool(head_differs)
    return model
