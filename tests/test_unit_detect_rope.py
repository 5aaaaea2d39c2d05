"""detect/rope.py: rotary parameters from the config, the modeling source, or the default."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, config_for, write_checkpoint
from helpers import detect_until, read

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import rope
from scaffold.errors import UnsupportedArchitecture


def test_rope_theta_from_the_config(tmp_path):
    spec = detect_until(read(tmp_path, Shape(rope_theta=500000.0)), rope)
    assert spec.rope_parameters == {"rope_theta": 500000.0, "rope_type": "default"}
    assert spec.partial_rotary_factor == 1.0 and spec.rope_neox_style is True and spec.no_rope_layers == []


def test_rope_theta_absent_from_the_config_is_read_from_the_modeling_default(tmp_path):
    config = config_for(Shape())
    del config["rope_theta"]
    write_checkpoint(tmp_path, Shape(), config=config)
    (tmp_path / "modeling_x.py").write_text("def f(config):\n    return getattr(config, 'rope_theta', 250000.0)\n")
    spec = detect_until(read_checkpoint(tmp_path), rope)
    assert spec.rope_parameters["rope_theta"] == 250000.0
    assert spec.source("rope_parameters").kind == "code"


def test_rope_scaling_type_becomes_rope_type(tmp_path):
    shape = Shape(extra={"rope_scaling": {"type": "linear", "factor": 2.0}})
    spec = detect_until(read(tmp_path, shape), rope)
    assert spec.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}


def test_partial_rotary_and_no_rope_layers(tmp_path):
    shape = Shape(layers=3, extra={"partial_rotary_factor": 0.5, "no_rope_layers": [1, 0, 1]})
    spec = detect_until(read(tmp_path, shape), rope)
    assert spec.partial_rotary_factor == 0.5 and spec.no_rope_layers == [1]


def test_an_unknown_rope_type_is_refused(tmp_path):
    shape = Shape(extra={"rope_scaling": {"rope_type": "mystery", "factor": 2.0}})
    with pytest.raises(UnsupportedArchitecture, match="'mystery'"):
        detect_until(read(tmp_path, shape), rope)


GPTJ_STYLE = '''
import torch


def rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class Attention(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.rotary_dim = config.rotary_dim
'''


def test_a_count_of_rotated_dims_under_a_key_the_code_keeps_and_gpt_j_pairing(tmp_path):
    """GPT-J's code: `self.rotary_dim = config.rotary_dim` (a count of dims, not a fraction) and
    rotate_every_two, which takes the even and the odd channels apart."""
    shape = Shape(head_dim=32, extra={"rotary_dim": 16})
    config = config_for(shape)
    write_checkpoint(tmp_path, shape, config=config)
    (tmp_path / "modeling_x.py").write_text(GPTJ_STYLE)
    spec = detect_until(read_checkpoint(tmp_path), rope)
    assert spec.partial_rotary_factor == 0.5 and spec.source("partial_rotary_factor").expr == "config.rotary_dim"
    assert spec.rope_neox_style is False and "modeling_x.py:6" in str(spec.source("rope_neox_style"))


LAB_REVERSED = '''
import torch


def rotate(x):
    d = x.shape[-1] // 2
    return torch.cat([x[..., d:], -x[..., :d]], -1)


def apply_rotary(q, k, cos, sin):
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
'''

LAB_STANDARD = LAB_REVERSED.replace("[x[..., d:], -x[..., :d]]", "[-x[..., d:], x[..., :d]]")


def test_a_rotation_by_minus_theta_written_in_a_lab_style_is_ported_reversed(tmp_path):
    """NanoChat's rotate_half returns cat((x2, -x1)): a rotation by -theta. A lab's code may name the function
    otherwise and cut the halves inline, in a list."""
    write_checkpoint(tmp_path, Shape())
    (tmp_path / "modeling_x.py").write_text(LAB_REVERSED)
    spec = detect_until(read_checkpoint(tmp_path), rope)
    assert spec.rope_reversed is True and spec.rope_neox_style is True
    assert spec.source("rope_reversed").kind == "code" and "modeling_x.py:7" in str(spec.source("rope_reversed"))


def test_the_usual_rotation_by_plus_theta_is_not_reversed(tmp_path):
    write_checkpoint(tmp_path, Shape())
    (tmp_path / "modeling_x.py").write_text(LAB_STANDARD)
    spec = detect_until(read_checkpoint(tmp_path), rope)
    assert spec.rope_reversed is False and spec.rope_neox_style is True


def test_a_rotation_by_minus_theta_of_adjacent_pairs_is_refused(tmp_path):
    """GPT-J style pairs with the sign the other way round (stack((x2, -x1)) of the odd and even channels): the
    port swaps halves, not pairs, so it refuses."""
    write_checkpoint(tmp_path, Shape())
    (tmp_path / "modeling_x.py").write_text(GPTJ_STYLE.replace("(-x2, x1)", "(x2, x1 * -1)"))
    with pytest.raises(UnsupportedArchitecture, match=r"turns by -theta .*adjacent channel pairs \(GPT-J style\)"):
        detect_until(read_checkpoint(tmp_path), rope)


NESTED_REVERSED = '''
import torch


class RoPE(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        def rot(x):
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
            return torch.cat([x2, x1 * -1], -1)

        return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def inline(q, cos, sin, d):
    return q * cos + torch.cat((q[..., d:], -q[..., :d]), dim=-1) * sin
'''


@pytest.mark.parametrize("body, line", [(NESTED_REVERSED.split("\n\ndef inline")[0], 9),
                                        (NESTED_REVERSED.split("class RoPE")[0] + "def inline"
                                         + NESTED_REVERSED.split("def inline")[1], 6)])
def test_a_rotation_by_minus_theta_in_a_nested_rot_or_inline_is_found(tmp_path, body, line):
    """Wren's lab code keeps its rotate as a function `rot` nested in forward; other code swaps the halves inline,
    with no function of its own: both are read (a rotation by -theta ported as the usual one would be wrong)."""
    write_checkpoint(tmp_path, Shape())
    (tmp_path / "modeling_x.py").write_text(body)
    spec = detect_until(read_checkpoint(tmp_path), rope)
    assert spec.rope_reversed is True and f"modeling_x.py:{line}" in str(spec.source("rope_reversed"))


@pytest.mark.parametrize("line, why", [
    ("rope_neox_style = false", "the rotary pairs adjacent channels (GPT-J style)"),
    ('position_scheme = "alibi"', "the position scheme is not rotary"),
])
def test_a_reversed_rotation_the_port_cannot_swap_is_refused_in_a_spec_file(tmp_path, line, why):
    """rope_reversed set by hand where the port's swap of q/k rows does not compute it: refused, no port written."""
    from helpers import EXAMPLES, scaffold

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(f"rope_reversed = true\n{line}\n")
    proc = scaffold("new", EXAMPLES / "demolm", "-o", tmp_path / "port", "--spec", spec_file, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "rope_reversed" in proc.stderr and why in proc.stderr, proc.stderr
    assert not (tmp_path / "port").exists()
