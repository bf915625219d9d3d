"""Model description: the registry of names and families (`registry`), the depth structure a family declares
(`depth`), timm's feature interface (`features`), and the families, one file each (importing one registers its
models). RetNet's retention maths lives in ``retention.py`` beside it, as fla keeps ops apart from models."""

from . import mobilenetv2, plainresnet, resnetv2, retnet, tresnet  # noqa: F401 - importing registers the families
