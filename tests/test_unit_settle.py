"""What reading the code leaves open is recorded, not guessed (no model built, no code run).

The finch lab example cuts its fused gate/up projection inside a helper the static analysis does not
follow; its headers (a w_in of twice the rows w_out takes) say the MLP is gated. Detection must leave
gate_up_order unknown with both candidates, and scaffold.settle must not run anything without consent.
The engine-side settling (running the MLP) is tests/test_settle.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

from ckpt_factory import write_checkpoint
from helpers import EXAMPLES

from scaffold.analysis import partial
from scaffold.checkpoint import read_checkpoint
from scaffold.settle import SETTLERS, settle

LABS = EXAMPLES / "labs"


def lab_headers(name: str, root, tensors: dict):
    """A lab checkpoint's config.json (as examples/labs/build.py writes it), its sources and zero tensors."""
    spec = importlib.util.spec_from_file_location("labs_build", LABS / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    root.mkdir(parents=True)
    build.write_config(name, root)
    config = json.loads((root / "config.json").read_text())
    write_checkpoint(root, None, data="zeros", tensors=tensors, config=config)
    for kind in ("configuration", "modeling"):
        shutil.copyfile(LABS / name / f"{kind}_{name}.py", root / f"{kind}_{name}.py")
    return root


def finch_tensors(layers: int = 2) -> dict:
    out = {"net.emb.weight": [384, 128], "net.norm_final.weight": [128], "logits_proj.weight": [384, 128]}
    for i in range(layers):
        p = f"net.h.{i}."
        out |= {p + "pre_attn_norm.weight": [128], p + "pre_ffn_norm.weight": [128],
                p + "attn.q.weight": [128, 128], p + "attn.k.weight": [64, 128], p + "attn.v.weight": [64, 128],
                p + "attn.out.weight": [128, 128], p + "ffn.w_in.weight": [384, 128], p + "ffn.w_out.weight": [128, 192]}
    return out


def test_a_gate_half_the_code_reading_cannot_tell_is_unknown_with_both_candidates(tmp_path):
    root = lab_headers("finch", tmp_path / "finch", finch_tensors())
    _, spec = partial(root)  # no consent: nothing runs
    assert spec.mlp_kind == "gated" and spec.gate_up_layout == "fused"
    assert spec.source("gate_up_layout").kind == "tensor"
    unknown = spec.unknowns["gate_up_order"]
    assert [c for c, _ in unknown.candidates] == ["gate_first", "up_first"]
    assert "--trust-remote-code" in unknown.reason and "384 output rows, twice the 192 inputs" in unknown.reason
    assert set(spec.unknowns) == {"gate_up_order"}


def test_without_consent_settle_leaves_it_unknown(tmp_path):
    root = lab_headers("finch", tmp_path / "finch", finch_tensors())
    _, spec = partial(root)
    request = SETTLERS["gate_up_order"](spec)
    assert request == {"field": "gate_up_order", "module": "net.h.0.ffn", "fused": "w_in", "down": "w_out",
                       "act": "silu", "intermediate_size": 192, "hidden_size": 128}
    settle(spec, read_checkpoint(root), allowed=False)
    assert "gate_up_order" in spec.unknowns


def test_a_plain_mlp_of_matching_widths_is_not_taken_for_a_gated_one(tmp_path):
    """The rule needs the up rows to be twice the down inputs: finch's code with a w_in as wide as w_out takes
    reads as the plain MLP the code analysis sees, with nothing left open."""
    tensors = {n: ([192, 128] if n.endswith("ffn.w_in.weight") else s) for n, s in finch_tensors().items()}
    root = lab_headers("finch", tmp_path / "finch", tensors)
    _, spec = partial(root)
    assert spec.mlp_kind == "plain" and "gate_up_order" not in spec.unknowns
