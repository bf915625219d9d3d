"""Model description: the registry of names and families (`registry`), the depth structure a family declares
(`depth`), timm's feature interface (`features`), and the families, one file each (importing one registers its
models; RetNet is a package). Any other timm model comes through `timm_any`, its depth units discovered from its graph
(`discovery`)."""

from . import hf_lm, mobilenetv2, plainresnet, resnetv2, retnet, timm_any, tresnet  # noqa: F401 - registers the families
