"""The model families, one file each (importing a file registers its models). RetNet's retention maths lives in
``retention.py`` beside it, as fla keeps ops apart from models."""

from . import mobilenetv2, plainresnet, resnetv2, retnet, tresnet  # noqa: F401 - importing registers the families
