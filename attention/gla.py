"""Gated linear attention (GLA, Yang et al. 2023): attention=gla, the linear family's member whose
four parts are its own keys, so that one name covers the family's ablations.

GLA itself is data / identity / rms / swish: a data-dependent decay g = logsigmoid(W2 W1 x) / 16
(rank 16), no feature map, a per-head RMSNorm and a swish output gate. The knobs:

    gla_gate         data | fixed | none             (the decay)
    gla_feature_map  identity | elu | relu | softmax
    gla_norm         rms | sum | none                (the normaliser)
    gla_output_gate  swish | none

The combinations that are papers of their own have their own names and files (attention/linear.py,
retnet.py, efficient.py); the parts, the recurrence and its dispatch are attention/linear_family.py.
"""
from attention.linear_family import (
    DECAYS,
    FEATURE_MAPS,
    NORMS,
    OUTPUT_GATES,
    LinearFamilyAttention,
    Recipe,
)

KNOBS = {"decay": "gla_gate", "feature_map": "gla_feature_map", "norm": "gla_norm", "output_gate": "gla_output_gate"}


class GatedLinearAttention(LinearFamilyAttention):
    owned_keys = ("gla_gate", "gla_feature_map", "gla_chunk", "gla_output_gate", "gla_norm", "gla_conv")
    recipe = Recipe(decay="data", feature_map="identity", norm="rms", output_gate="swish")   # GLA's (the defaults)

    @classmethod
    def recipe_of(cls, config) -> Recipe:
        return Recipe(**{part: getattr(config, key) for part, key in KNOBS.items()})

    @classmethod
    def part(cls, config, name: str) -> str:
        return f"{KNOBS[name]}={getattr(config, KNOBS[name])}"

    @classmethod
    def check_config(cls, config):
        for key, allowed in (("gla_gate", DECAYS), ("gla_feature_map", tuple(FEATURE_MAPS)), ("gla_norm", NORMS),
                             ("gla_output_gate", OUTPUT_GATES)):
            if getattr(config, key) not in allowed:
                raise ValueError(f"unknown {key}={getattr(config, key)!r}; choose one of {', '.join(allowed)}")
        super().check_config(config)
