"""depthzoo: a model zoo whose models expose their depth structure for latency-aware depth pruning.

``import zoo`` needs only PyTorch and timm: Hydra and W&B belong to the entry points and the logger.
"""

from . import models  # noqa: F401 - importing registers the families
from .deploy.export import export
from .deploy.fuse import fuse
from .errors import ExportError, PlanError, UnknownModelError, WeightsError, ZooError
from .models.depth import DepthUnit
from .models.discovered import depth_units
from .models.registry import (
    get_entry,
    get_family,
    is_model,
    list_families,
    list_models,
    register_family,
    register_model,
)
from .pruning.surgery import apply_plan, remove_units
from .weights.checkpoint import read_checkpoint_meta, save_checkpoint
from .weights.create import create_model, load
from .weights.tags import known_tags, model_info

__version__ = "0.1.0"

__all__ = [
    "DepthUnit", "ExportError", "PlanError", "UnknownModelError", "WeightsError", "ZooError", "apply_plan",
    "create_model", "depth_units", "export", "fuse", "get_entry", "get_family", "is_model", "known_tags",
    "list_families", "list_models", "load", "model_info", "read_checkpoint_meta", "register_family", "register_model",
    "remove_units", "save_checkpoint",
]
