"""detect/mlp.py: the activation and the MLP projections' shapes."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import mlp
from scaffold.errors import CheckpointError, UnsupportedArchitecture


def test_silu_gated_mlp(tmp_path):
    spec = detect_until(read(tmp_path), mlp)
    assert spec.mlp_kind == "gated" and spec.hidden_act == "silu" and spec.mlp_bias is False


def test_the_activation_key_the_code_indexes_act2fn_with_wins(tmp_path):
    shape = Shape(extra={"hidden_act": "silu", "hidden_activation": "gelu_pytorch_tanh"})
    write_checkpoint(tmp_path, shape)
    (tmp_path / "modeling_x.py").write_text("act = ACT2FN[config.hidden_activation]\n")
    spec = detect_until(read_checkpoint(tmp_path), mlp)
    assert spec.hidden_act == "gelu_pytorch_tanh"


def test_an_activation_without_a_vllm_kernel_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match="'softsign'"):
        detect_until(read(tmp_path, Shape(extra={"hidden_act": "softsign"})), mlp)


def test_a_down_proj_of_the_wrong_shape_is_refused(tmp_path):
    shape = Shape(hidden=64, intermediate=96)
    tensors = tensors_for(shape)
    for layer in range(shape.layers):  # every layer alike: one odd layer is a different error
        tensors[f"model.layers.{layer}.mlp.down_proj.weight"] = [64, 64]
    write_checkpoint(tmp_path, shape, tensors=tensors)
    with pytest.raises(CheckpointError, match=r"down_proj.weight has shape \[64, 64\].*need \[64, 96\]"):
        detect_until(read_checkpoint(tmp_path), mlp)


# A lab's dense MLP computing GPT-OSS's clamped form with plain gate and up projections: ported as act(gate) * up it
# was 3.5 off in the engine; the reader names what the port does not compute instead.
CLAMPED_MLP = '''
class OrioleMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_gate = nn.Linear(config.d, config.f, bias=False)
        self.w_in = nn.Linear(config.d, config.f, bias=False)
        self.w_out = nn.Linear(config.f, config.d, bias=False)
        self.limit = config.limit

    def forward(self, x):
        g, u = self.w_gate(x), self.w_in(x)
        {gate_line}
        return self.w_out(F.silu(g) * {up})


class OrioleLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ffn = OrioleMLP(config)
'''


@pytest.mark.parametrize("gate_line, up, altered", [
    ("g = torch.clamp(g, max=self.limit)", "u", "torch.clamp(g, max=self.limit)"),
    ("g = g.clip(-self.limit, self.limit)", "u", "g.clip(-self.limit, self.limit)"),
    ("pass", "(u + 1)", "u + 1"),
    ("pass", "(1.0 - u)", "1.0 - u"),
    ("g = g.float()", "u", None),
])
def test_an_mlp_that_changes_its_projections_outputs_is_named(gate_line, up, altered):
    from scaffold.detect.mlp import altered_projection

    code = {"modeling_oriole.py": CLAMPED_MLP.format(gate_line=gate_line, up=up)}
    found = altered_projection(code, "ffn", {"w_gate", "w_in"})
    assert (found.split(": ", 1)[1] if found else None) == altered
