"""Training library behind ``train.py`` (and the pruning fine-tune): data, engine, checkpoints, loggers.

Needs only torch and timm to import; Hydra, OmegaConf and W&B are imported where they are used.

Library API::

    from zoo.training import build_loaders, fit, evaluate, Callback, create_logger

    from zoo.training.settings import DataConfig, OptimConfig, TrainerConfig

    data = build_loaders(DataConfig(name="digits"), seed=0)   # typed settings (the `data` group's schema)
    model = zoo.create_model("mobilenetv2_050", num_classes=data.num_classes)  # or any built nn.Module
    result = fit(model, data, OptimConfig(), TrainerConfig(max_epochs=2), logger=None,  # `optim`/`trainer`
                 teacher=None, distill_weight=0.0, callbacks=[MyCallback()], output_dir="runs/x")
    result.metrics, result.last_checkpoint, result.best_checkpoint
    evaluate(model, data.val, task=data.task)                 # {"loss", "acc1", "acc5"} or {"loss", "ppl", ...}

- :func:`build_loaders` (:mod:`.data`): data sets digits, cifar10, cifar100, imagefolder, synthetic (images)
  and bytes, text (byte-level LM); returns a :class:`DataBundle` (loaders, task, num_classes, input_size).
- :func:`fit` (:mod:`.engine`): trains an already-built model (e.g. one pruning has modified) with timm's
  optimizer/scheduler factories, AMP, channels_last, torch.compile, gradient accumulation and clipping,
  label smoothing, mixup/cutmix, EMA, DDP under torchrun; optional knowledge distillation from `teacher`
  (``(1-w)*task + w*T^2*KL`` on softened logits, per token for LMs); :class:`Callback` hooks per step
  and epoch (``trainer.progress`` goes 0 -> 1, e.g. to blend activations towards identity). Returns a
  :class:`FitResult`. Checkpoints ``last``/``best`` in ``<output_dir>/checkpoints`` (:mod:`.state`).
- :func:`evaluate` (:mod:`.evaluation`): metrics of a model on a loader (reduced over ranks).
- :func:`model_name_from_checkpoint`: the model name in a checkpoint, for ``zoo.create_model(name, pretrained=p)``.
- :func:`create_logger` (:mod:`.logger`): W&B (offline by default) or nothing.
- ``zoo.jobs.train.run(cfg)``: a whole run from a composed Hydra config (what ``train.py`` does).

Class-count policy: ``model.num_classes: null`` takes the data set's count; an explicit different count is a
ConfigError. Language models get ``vocab_size=256`` unless overridden (smaller is an error).
"""

from ..errors import CheckpointError, ConfigError, DataError, NonFiniteLossError, TrainingInterrupted
from .data import DataBundle, build_loaders
from .engine import Callback, FitResult, Trainer, fit
from .evaluation import evaluate
from .logger import NullLogger, WandbLogger, create_logger
from .resources import seed_everything
from .state import model_name_from_checkpoint

__all__ = [
    "Callback", "CheckpointError", "ConfigError", "DataBundle", "DataError", "FitResult", "NonFiniteLossError",
    "NullLogger", "Trainer", "TrainingInterrupted", "WandbLogger", "build_loaders", "create_logger", "evaluate",
    "fit", "model_name_from_checkpoint", "seed_everything",
]

