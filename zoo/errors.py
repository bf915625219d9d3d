"""Errors users see: each says what was wrong and what is allowed."""


class ZooError(ValueError):
    """Base class of depthzoo's user-facing errors."""


class UnknownModelError(ZooError):
    """A model name that is not registered."""


class WeightsError(ZooError):
    """A weight file or hub id that cannot be loaded into the requested model."""


class PlanError(ZooError):
    """A pruning plan that does not fit the model."""
