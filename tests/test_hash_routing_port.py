"""Hash routing (DeepSeek-V4's first hash_moe layers: each token's experts are its row of an integer table indexed
by its token id, weighted by the router's scores there) ported and verified in the real vLLM engine against
transformers running the checkpoint's own remote code (tests/hash_routing_ckpt.py builds it: a tiny Qwen3-MoE whose
layer 0 routes by a lab's table `expert_table`, int32, the other layers by the router's top-k).

The table is random: with the experts chosen by the router's top-k instead, transformers' own log-probabilities move
by about 2, so a port that ignored the table could not pass."""

from __future__ import annotations

import pytest
import tomllib
from hash_routing_ckpt import build
from helpers import own_weight_tests_pass, scaffold, verified_at_parity


@pytest.mark.slow
def test_the_table_matters_on_the_lab_checkpoint(tmp_path):
    """The checkpoint's table changes what transformers computes: a port that routed layer 0 by its scores could not
    pass. Every expert of the table moved by one: far from the checkpoint's."""
    import torch
    from transformers import AutoModelForCausalLM

    ckpt = build(tmp_path / "hashmoe")
    model = AutoModelForCausalLM.from_pretrained(ckpt, trust_remote_code=True, dtype=torch.float32)
    table = model.model.layers[0].mlp.gate.expert_table
    assert table.dtype == torch.int32  # the buffer as the checkpoint stores it, not cast to float
    ids = torch.randint(3, 200, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hashed = model(ids).logits.log_softmax(-1)
        table.copy_((table + 1) % 4)
        moved = model(ids).logits.log_softmax(-1)
    assert (hashed - moved).abs().max().item() > 0.5


@pytest.mark.engine
@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.extended)], ids=["tp1", "tp2"])
def test_hash_routing_port_at_parity(tp, tmp_path):
    ckpt = build(tmp_path / "hashmoe")
    out = tmp_path / "port"
    new = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused the hash-routed checkpoint:\n{new.stderr[-3000:]}"
    spec = tomllib.loads((out / "scaffold_spec.toml").read_text(encoding="utf-8"))["spec"]
    assert (spec["hash_layers"], spec["hash_condition"], spec["hash_table"], spec["hash_renormalize"]) == \
        ([0], "layer_idx < config.hashed_layers", "expert_table", True)
    model = next(out.glob("*/model.py")).read_text(encoding="utf-8")
    assert "self.hash_renormalize = config.norm_topk_prob" in model
    assert "custom_routing_function=top_k_of_weights" in model
    # Over two ranks each holds half of every expert's width; the table and the router are whole on each.
    checks = verified_at_parity(out, "--trust-remote-code", "--tp", str(tp))
    if tp > 1:
        assert f"tensor_parallel_size={tp}" in checks["port loaded by vLLM"]["detail"]
        return
    # The port's own weight-mapping tests: the table lands on the router's integer parameter.
    own_weight_tests_pass(out)


@pytest.mark.slow
def test_a_hash_router_without_its_table_is_refused(tmp_path):
    """The code routes layer 0 by a table the checkpoint does not hold (a buffer not saved): a port routing that layer
    by the router's scores would compute something else, so it is refused by name."""
    from safetensors.torch import load_file, save_file

    ckpt = build(tmp_path / "hashmoe")
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.0.mlp.gate.expert_table"]
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    proc = scaffold("new", ckpt, "-o", tmp_path / "port", "--trust-remote-code", "--impl", "native", check=False)
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2, message
    assert ("hash routing (LabTokenHashGate.forward indexes expert_table by token_ids (modeling_hashmoe.py:" in message
            and "in layers [0] whose table the checkpoint does not hold" in message), message


@pytest.mark.engine
@pytest.mark.extended  # the tp1 case above verifies the same port on the checkpoint itself
def test_hash_routing_port_verified_on_its_twin(tmp_path):
    """`scaffold verify --twin` on the hash-routed checkpoint: the twin keeps the integer table (rows drawn as
    distinct experts, scaffold.verify.twin) and the port is at parity on it."""
    ckpt = build(tmp_path / "hashmoe")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out, "--trust-remote-code")
    checks = verified_at_parity(out, "--trust-remote-code", "--twin")
    assert "built from" in checks["twin"]["detail"], checks["twin"]
