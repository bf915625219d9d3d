"""RetNet (Sun et al., 2023), one family in a package, as flash-linear-attention keeps it: the retention maths
(`ops`), the sizes and option values (`config`), the layers (`layers`), the model and its registered sizes (`model`),
the constant-cost decoder with its INT8 path (`decode`), the forms `zoo.export` traces (`forms`), and the published
checkpoint formats both ways (`convert`). Importing the package registers the family."""

from .config import DECAYS, DECODES, GPT2_VOCAB, MODES, RETNET_SIZES, ROPES
from .convert import fla_form, fla_options, fla_state_dict, read_foreign, torchscale_options, torchscale_state_dict
from .decode import RecurrentDecoder, RecurrentStep, decode_step
from .forms import ParallelForm, RecurrentForm
from .layers import GatedFFN, Int8Projection, MultiScaleRetention, RetNetBlock, RetNetInputError, RetNetState, RMSNorm
from .model import RetNet

__all__ = [
    "DECAYS", "DECODES", "GPT2_VOCAB", "MODES", "RETNET_SIZES", "ROPES", "GatedFFN", "Int8Projection",
    "MultiScaleRetention", "ParallelForm", "RMSNorm", "RecurrentDecoder", "RecurrentForm", "RecurrentStep", "RetNet",
    "RetNetBlock", "RetNetInputError", "RetNetState", "decode_step", "fla_form", "fla_options", "fla_state_dict",
    "read_foreign", "torchscale_options", "torchscale_state_dict",
]
