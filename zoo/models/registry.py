"""Model registry: one name per architecture (the same names as timm where timm has the model), its builder, its
task and its default (pretrained) configuration. Building with weights is :mod:`zoo.factory`'s job."""

from __future__ import annotations

import difflib
import fnmatch
import inspect
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import ModelOptionError, UnknownModelError, UnknownOptionError

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelEntry:
    """A registered architecture: its builder and its default (pretrained) configuration. `precheck`: what can be
    known of a model before any work, from its options alone (raises a ZooError with the reason; None: nothing)."""

    name: str
    family: str
    builder: Callable[..., nn.Module]
    default_cfg: dict[str, Any] = field(default_factory=dict)
    task: str = "classification"  # or "language_model": what data and loss the model takes
    precheck: Callable[[dict[str, Any]], None] | None = None


_REGISTRY: dict[str, ModelEntry] = {}
_RESOLVERS: list[Callable[[str], ModelEntry | None]] = []  # names made on first use (``timm/<arch>``)
_RESOLVED: dict[str, ModelEntry] = {}


def register_resolver(resolve: Callable[[str], ModelEntry | None]) -> None:
    """Add a function that makes the entry of a name no builder registered (None for a name it does not know):
    ``timm/<arch>`` for every timm model. Its entries are made on first use and not listed by :func:`list_models`."""
    _RESOLVERS.append(resolve)


TASKS = ("classification", "language_model")
CAPABILITIES = {  # what a family can declare; tests and benchmarks select families by these
    "timm": "timm has the same architecture under the same names (state dicts, logits, features compared with timm's)",
    "features": "features_only and forward_intermediates, timm's feature-extraction interface",
    "grad_checkpointing": "set_grad_checkpointing saves activation memory worth a target (benchmarks.train_memory)",
    "published_weights": "loads weights people publish (timm tags, or the family's own checkpoint formats)",
    "decode": "autoregressive generation with a recurrent state",
}


# What a family can be deployed to, declared once per family: for each kind (the deploy runtimes its latency table can
# be timed in, the export formats, quantisation, the pruning workloads) every value is either supported (None) or
# refused with the reason and what to do instead. prune.py's validation refuses from this table before any work, and a
# test checks that every family names every runtime, format and workload the code knows, so a new one cannot be
# forgotten. Values that depend on a model's options are checked by `option_checks` (options -> reason or None).
DEPLOY_KINDS = ("runtime", "export", "quantize", "workload")
_NO_HF = ("writes a Hugging Face model folder, which only a language model with one (RetNet, as a "
          "flash-linear-attention model) has: use prune.export=onnx or torch_export")
_NO_DECODE = ("times one recurrent decode step, which needs a language model with a decode state: use "
              "prune.workload=forward")
CLASSIFIER_DEPLOY = {  # an image classifier of convolutions: every runtime, ONNX and torch.export, INT8, forward
    "runtime": {"eager": None, "compile": None, "onnxruntime": None, "tensorrt": None},
    "export": {"onnx": None, "torch_export": None, "hf": _NO_HF},
    "quantize": {"int8": None},
    "workload": {"forward": None, "decode": _NO_DECODE},
}


@dataclass(frozen=True)
class Family:
    """What a model family declares about itself, once, beside its models: tests and benchmarks iterate these
    (:func:`list_families`) instead of keeping lists of model names.

    reference: the member benchmarks time at full size. small: the member tests build, with `small_options` (builder
    options that keep the family's depth structure and make it fast) at `test_input_size` ((C, H, W) or (tokens,)).
    deploy: per kind of :data:`DEPLOY_KINDS`, each value supported (None) or refused with its reason.
    option_checks: ``"kind:value"`` -> a function of the model's options giving the reason it is refused, or None.
    """

    name: str
    task: str
    reference: str
    small: str
    test_input_size: tuple[int, ...]
    small_options: dict[str, Any] = field(default_factory=dict)
    capabilities: frozenset[str] = frozenset()
    deploy: dict[str, dict[str, str | None]] = field(default_factory=lambda: CLASSIFIER_DEPLOY)
    option_checks: dict[str, Callable[[dict[str, Any]], str | None]] = field(default_factory=dict)
    dynamic: bool = False  # its members are made on first use (any timm model), not declared one by one

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def refusal(self, kind: str, value: str, options: dict[str, Any] | None = None) -> str | None:
        """Why this family cannot do `value` of `kind` (a runtime, export format, quantisation, workload), or None
        when it can. A value the family does not declare is refused: nothing is assumed."""
        declared = self.deploy.get(kind, {})
        if value not in declared:
            return (f"the {self.name} family does not declare {kind} {value!r} (it declares "
                    f"{', '.join(declared) or 'none'})")
        if declared[value] is not None:
            return declared[value]
        check = self.option_checks.get(f"{kind}:{value}")
        return check(options or {}) if check is not None and options is not None else None

    def supported(self, kind: str) -> list[str]:
        """The values of `kind` this family supports (whatever its options)."""
        return [value for value, why in self.deploy.get(kind, {}).items() if why is None]


_FAMILIES: dict[str, Family] = {}


def register_model(family: str, task: str = "classification", **default_cfg: Any) -> Callable:
    """Decorator registering a builder function under its own name (a name can be registered once).

    `task`: ``classification`` or ``language_model``. `default_cfg` holds timm-style metadata: input_size, mean,
    std, num_classes, hf_hub_id, interpolation, crop_pct, first_conv, classifier.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; allowed: {', '.join(TASKS)}.")

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if fn.__name__ in _REGISTRY:
            first = _REGISTRY[fn.__name__].builder.__module__
            raise ValueError(f"Model {fn.__name__!r} is registered already (by {first}); a name is registered once.")
        _REGISTRY[fn.__name__] = ModelEntry(fn.__name__, family, fn, dict(default_cfg), task)
        return fn

    return wrap


def register_family(name: str, *, task: str = "classification", reference: str, small: str,
                    test_input_size: tuple[int, ...], small_options: dict[str, Any] | None = None,
                    capabilities: tuple[str, ...] = (), deploy: dict[str, dict[str, str | None]] | None = None,
                    option_checks: dict[str, Callable[[dict[str, Any]], str | None]] | None = None,
                    dynamic: bool = False) -> Family:
    """Declare a family (after its models are registered): its task, its reference and small members, a fast test
    input, its capabilities (keys of :data:`CAPABILITIES`) and what it can be deployed to (`deploy`, by
    :data:`DEPLOY_KINDS`; an image classifier's default: :data:`CLASSIFIER_DEPLOY`). A family is declared once.
    `dynamic`: its members are made on first use by a resolver (:func:`register_resolver`), not registered."""
    unknown = sorted(set(capabilities) - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"Unknown capabilities {unknown} for family {name!r}; allowed: {', '.join(CAPABILITIES)}.")
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; allowed: {', '.join(TASKS)}.")
    if name in _FAMILIES:
        raise ValueError(f"Family {name!r} is declared already; a family is declared once.")
    if deploy is None and task != "classification":
        raise ValueError(f"Family {name!r} is a {task}: declare what it can be deployed to (deploy=..., by "
                         f"{', '.join(DEPLOY_KINDS)}); only image classifiers have a default.")
    deploy = CLASSIFIER_DEPLOY if deploy is None else deploy
    if sorted(deploy) != sorted(DEPLOY_KINDS):
        raise ValueError(f"Family {name!r} declares deploy kinds {sorted(deploy)}; give each of "
                         f"{', '.join(DEPLOY_KINDS)}.")
    for member in () if dynamic else (reference, small):
        entry = _REGISTRY.get(member)
        if entry is None or entry.family != name or entry.task != task:
            raise ValueError(f"Family {name!r} names {member!r}, which is not one of its registered {task} models.")
    family = Family(name, task, reference, small, tuple(test_input_size), dict(small_options or {}),
                    frozenset(capabilities), deploy, dict(option_checks or {}), dynamic)
    _FAMILIES[name] = family
    return family


def list_families(capability: str | None = None, task: str | None = None, dynamic: bool = False) -> list[Family]:
    """The declared families (sorted by name), those with `capability` and of `task` when given; with `dynamic`, also
    the families whose members are made on first use (``timm``: any timm model), which tests and benchmarks that run
    every declared family leave out."""
    if capability is not None and capability not in CAPABILITIES:
        raise ValueError(f"Unknown capability {capability!r}; allowed: {', '.join(CAPABILITIES)}.")
    return [f for _, f in sorted(_FAMILIES.items())
            if (capability is None or f.has(capability)) and (task is None or f.task == task)
            and (dynamic or not f.dynamic)]


def get_family(name: str) -> Family:
    """A declared family by name (a registered model's ``get_entry(model).family``)."""
    if name not in _FAMILIES:
        raise UnknownModelError(f"Unknown family {name!r}; declared: {', '.join(sorted(_FAMILIES))}.")
    return _FAMILIES[name]


PLUGINS_ENV = "DEPTHZOO_MODULES"
PLUGIN_GROUP = "depthzoo.models"
_loaded_plugins: set[str] = set()


def load_plugins() -> list[str]:
    """Import the modules that register more model families: those named (comma-separated) in
    ``$DEPTHZOO_MODULES`` and the ``depthzoo.models`` entry points of installed packages. Idempotent; the command
    lines call it before they list or build models. Returns the modules imported now."""
    import importlib
    from importlib.metadata import entry_points

    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    names += [ep.value.split(":")[0] for ep in entry_points(group=PLUGIN_GROUP)]
    imported = []
    for name in names:
        if name in _loaded_plugins:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UnknownModelError(f"Cannot import model module {name!r} (from ${PLUGINS_ENV} or the "
                                    f"{PLUGIN_GROUP} entry points): {exc}. Check the name and that its folder is on "
                                    f"PYTHONPATH.") from None
        _loaded_plugins.add(name)
        imported.append(name)
    return imported


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style pattern, e.g. ``"mobilenetv2_*"``."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def is_model(name: str) -> bool:
    """Whether `name` is a registered model or one a resolver makes (``timm/<arch>``)."""
    if name in _REGISTRY or name in _RESOLVED:
        return True
    try:
        return any(resolve(name) is not None for resolve in _RESOLVERS)
    except UnknownModelError:
        return False


def get_entry(name: str) -> ModelEntry:
    """The registry entry for `name` (the plugin modules are imported first when it is not registered yet: a
    checkpoint of a plugin family loads with ``$DEPTHZOO_MODULES`` set); an unknown name raises with the closest
    registered names."""
    if name in _RESOLVED:
        return _RESOLVED[name]
    if name not in _REGISTRY:
        for resolve in _RESOLVERS:
            entry = resolve(name)
            if entry is not None:
                _RESOLVED[name] = entry
                return entry
        load_plugins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f" Closest names: {', '.join(close)}." if close else ""
        raise UnknownModelError(
            f"Unknown model {name!r}.{hint} `zoo.list_models()` (or `python -m zoo list`) lists all "
            f"{len(_REGISTRY)} registered models."
        )
    return _REGISTRY[name]


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the architecture with random weights and attach its name, overrides and default_cfg."""
    entry = get_entry(name)
    try:
        model = entry.builder(**kwargs)
    except TypeError as exc:
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        options = ", ".join(builder_options(entry))
        if bad is not None:
            raise UnknownOptionError(f"{name} has no option {bad.group(1)!r} (from create_model(..., "
                                   f"{bad.group(1)}=...) or model.overrides); its options are: {options}.") from None
        given = {k: v for k, v in kwargs.items() if k != "num_classes"}
        if not given:
            raise
        error = UnknownOptionError if "unexpected keyword" in str(exc) else ModelOptionError
        raise error(f"{name} cannot be built with options {given} ({exc}); its options are: {options}.") from None
    own = model.__dict__.get("pretrained_cfg") or {}  # what timm's builder put there (pretrained_cfg_overlay too)
    cfg = {**entry.default_cfg, **timm_cfg(name), **own}
    cfg["architecture"] = name.removeprefix("timm/")
    if "num_classes" in kwargs:
        cfg["num_classes"] = kwargs["num_classes"]
    model.default_cfg = cfg
    model.pretrained_cfg = cfg
    model.zoo_name = name
    model.zoo_overrides = {k: v for k, v in kwargs.items() if k != "num_classes"}
    return model


def timm_cfg(name: str, tag: str | None = None) -> dict[str, Any]:
    """timm's whole pretrained config of the architecture `name` (``timm/<arch>``, or a declared family's member
    that timm has under the same name) for `tag` (None: timm's default), as timm puts it on the model; {} where timm
    has no such model or does not list the tag (a tag of the zoo's own)."""
    arch = name.removeprefix("timm/")
    family = _FAMILIES.get(get_entry(name).family)
    if not name.startswith("timm/") and not (family is not None and family.has("timm")):
        return {}
    from timm.models import get_arch_pretrained_cfgs, get_pretrained_cfg, is_model

    if not is_model(arch):
        return {}
    cfg = get_arch_pretrained_cfgs(arch).get(f"{arch}.{tag}") if tag else get_pretrained_cfg(arch)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.to_dict().items()} if cfg is not None else {}


def model_class(name: str) -> type:
    """The nn.Module class a registered name builds (built once on the meta device: no memory, no weights)."""
    with torch.device("meta"):
        return type(get_entry(name).builder())


def builder_options(entry: ModelEntry) -> list[str]:
    """The keyword options a registered model's class takes (what ``create_model(name, **options)`` accepts)."""
    with torch.device("meta"):
        model = entry.builder()
    return [p for p in inspect.signature(type(model).__init__).parameters if p not in ("self", "args", "kwargs")]
