"""Multipliers on the embedding, the residual branches and the logits, and final soft-capping."""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.attention import _number
from scaffold.detect.sourcecode import modeling_sources, sqrt_hidden_scale
from scaffold.spec import Source, Spec


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    hk = spec.source("hidden_size").expr or "config.hidden_size"
    if (mult := _number(ckpt, "embedding_multiplier")) is not None:
        spec.set("embedding_multiplier", mult, Source("config", "config.json embedding_multiplier",
                                                      "config.embedding_multiplier"))
    elif (found := sqrt_hidden_scale(modeling_sources(ckpt))) is not None:
        spec.set("embedding_multiplier", spec.hidden_size**0.5,
                 Source("code", f"{found}: embeddings scaled by hidden_size ** 0.5", f"{hk}**0.5"))
    else:
        spec.set("embedding_multiplier", None, Source("default", "embeddings used as they are"))
    if (mult := _number(ckpt, "residual_multiplier")) is not None:
        spec.set("residual_multiplier", mult, Source("config", "config.json residual_multiplier",
                                                     "config.residual_multiplier"))
    else:
        spec.set("residual_multiplier", None, Source("default", "sublayer outputs added as they are"))
    if (div := _number(ckpt, "logits_scaling")) is not None:
        spec.set("logits_scale", 1.0 / div, Source("config", "config.json logits_scaling (logits divided by it)",
                                                   "1.0 / config.logits_scaling"))
    elif (mult := _number(ckpt, "logit_scale")) is not None:
        spec.set("logits_scale", mult, Source("config", "config.json logit_scale", "config.logit_scale"))
    else:
        spec.set("logits_scale", None, Source("default", "logits as the head computes them"))
    if (cap := _number(ckpt, "final_logit_softcapping")) is not None:
        spec.set("final_logit_softcap", cap, Source("config", "config.json final_logit_softcapping",
                                                    "config.final_logit_softcapping"))
    else:
        spec.set("final_logit_softcap", None, Source("default", "no final_logit_softcapping in config.json"))
