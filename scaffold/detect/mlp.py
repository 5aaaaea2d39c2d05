"""MLP: activation and sizes."""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.common import set_from_config
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Spec

# Activations with a fused act-and-mul kernel in vLLM (get_act_and_mul_fn).
GATED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh")


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    act = set_from_config(spec, ckpt, "hidden_act", ("hidden_act", "hidden_activation", "activation_function"), str,
                          default="silu", runtime=False)
    if spec.mlp_kind == "gated" and act not in GATED_ACTIVATIONS:
        raise UnsupportedArchitecture(
            f"gated MLP activation {act!r} has no fused act-and-mul in vLLM; supported: {', '.join(GATED_ACTIVATIONS)}.",
            where,
        )
    for layer in range(spec.num_layers):
        for proj, shape in (
            ("gate_proj", (spec.intermediate_size, spec.hidden_size)),
            ("up_proj", (spec.intermediate_size, spec.hidden_size)),
            ("down_proj", (spec.hidden_size, spec.intermediate_size)),
        ):
            name = f"model.layers.{layer}.mlp.{proj}.weight"
            info = ckpt.tensors.get(name)
            if info is not None and info.shape != shape:
                raise CheckpointError(
                    f"tensor {name} has shape {list(info.shape)}, but hidden size {spec.hidden_size} and "
                    f"intermediate size {spec.intermediate_size} need {list(shape)}.",
                    where,
                )
        if spec.gate_extra_bias:
            name = f"model.layers.{layer}.mlp.{spec.gate_extra_bias}"
            info = ckpt.tensors.get(name)
            if info is None or info.shape != (spec.intermediate_size,):
                raise CheckpointError(f"tensor {name} must exist with shape [{spec.intermediate_size}].", where)
