"""The vLLM interfaces a port declares beside SupportsLoRA/PP/Quant, checked against vLLM's own classes.

- MixtureOfExperts (expert-parallel load balancing, EPLB) on a Qwen3-MoE-shaped port. vLLM 0.32's
  CPU build cannot serve with EPLB: `LLM(..., tensor_parallel_size=2, enable_expert_parallel=True,
  enable_eplb=True)` fails while making the config with "Expert parallelism load balancing is only
  supported on CUDA devices or ROCm devices or XPU devices now.", and expert parallelism without
  EPLB segfaults in csrc/cpu/cpu_fused_moe.cpp (line 242) at the first forward, with vLLM's own
  Qwen3MoeForCausalLM too. So the port and vLLM's Qwen3MoeForCausalLM are built in one process
  with EPLB switched on after the config is made and two redundant experts (interface_probe.py):
  the interface's attributes, every parameter after loading (the replicas included), the expert
  weights EPLB moves and a MoE block's output under vLLM's own EplbState must be the same, and
  the block's output that of the checkpoint's routing computed here. The engine run with EPLB
  needs the GPU machine.
- SupportsEagle3 on a Llama-shaped port: the auxiliary hidden states an engine gets from the
  port equal those of vLLM's own LlamaForCausalLM on the same checkpoint; and EAGLE-3 speculative
  decoding, which runs on the CPU build, serves the port with a tiny random drafter as it serves
  vLLM's Llama: the same greedy tokens and the same speculative-decoding counters. The random
  drafter's proposals are never accepted, so that run shows the port in EAGLE-3's path (the
  drafter's fc takes exactly the aux states the port returns), not that the drafts agree; the
  aux-state test above is the numeric check.
"""

from __future__ import annotations

import pytest
from conftest import scaffold
from interface_probe import run
from quantized_ckpt import with_architecture

PROMPT = [1, 5, 9, 22, 40, 7, 3, 80, 11, 2, 100, 17]


def test_ports_declare_vllms_interfaces():
    """Dense ports as vLLM's Llama (EAGLE-3, LoRA), MoE ports as its Qwen3-MoE (EAGLE-3, EPLB)."""
    from scaffold.model_context import choices, imports
    from scaffold.spec import Spec

    def imported(spec):
        stdlib, third_party = imports(spec, choices(spec, set()), True)
        return {name for imp in stdlib + third_party for name in imp.names}

    moe = Spec(mlp_kind="gated")
    moe.names = {**moe.names, "experts": "experts", "router": "gate"}
    assert choices(moe, set())["interfaces"] == ("MixtureOfExperts", "SupportsEagle3", "SupportsPP", "SupportsQuant")
    assert {"MixtureOfExperts", "SupportsEagle3", "get_ep_group", "get_current_vllm_config"} <= imported(moe)
    dense = Spec(mlp_kind="gated")
    assert choices(dense, set())["interfaces"] == ("SupportsEagle3", "SupportsLoRA", "SupportsPP", "SupportsQuant")
    assert not {"MixtureOfExperts", "get_ep_group", "get_current_vllm_config"} & imported(dense)


def eagle3_drafter(target, out, layers: list[int], seed: int = 11):
    """A random EAGLE-3 drafter (vLLM's Eagle3LlamaForCausalLM layout: one decoder layer over
    [embedding, fc(aux hidden states)]) for the Llama-shaped `target`, reading its `layers`."""
    import json

    import torch
    from safetensors.torch import save_file

    config = json.loads((target / "config.json").read_text())
    hidden, inter, head = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv, vocab = config["num_attention_heads"] * head, config["num_key_value_heads"] * head, config["vocab_size"]
    shapes = {"layers.0.self_attn.qkv_proj.weight": (q + 2 * kv, 2 * hidden),
              "layers.0.self_attn.o_proj.weight": (hidden, q),
              "layers.0.mlp.gate_up_proj.weight": (2 * inter, hidden), "layers.0.mlp.down_proj.weight": (hidden, inter),
              "layers.0.input_layernorm.weight": (hidden,), "layers.0.post_attention_layernorm.weight": (hidden,),
              "layers.0.hidden_norm.weight": (hidden,), "fc.weight": (hidden, len(layers) * hidden),
              "norm.weight": (hidden,), "embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden)}
    generator = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: 1 + 0.1 * torch.randn(shape, generator=generator) if len(shape) == 1
               else 0.08 * torch.randn(shape, generator=generator) for name, shape in shapes.items()},
              str(out / "model.safetensors"))
    config.update(architectures=["Eagle3LlamaForCausalLM"], num_hidden_layers=1,
                  eagle_aux_hidden_state_layer_ids=layers)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def moe_reference(checkpoint, hidden, layer: int = 0):
    """The MoE block of decoder layer `layer` computed from the checkpoint's tensors: softmax
    router, top-k experts with renormalized weights, SiLU-gated expert MLPs."""
    import json

    import torch
    from safetensors import safe_open

    config = json.loads((checkpoint / "config.json").read_text())
    tensors = {}
    for shard in checkpoint.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(f"model.layers.{layer}.mlp.")})
    prefix = f"model.layers.{layer}.mlp"
    x = torch.tensor(hidden)
    probs = torch.softmax(x @ tensors[f"{prefix}.gate.weight"].T, dim=-1)
    weights, chosen = probs.topk(config["num_experts_per_tok"], dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for weight, expert in zip(weights[token], chosen[token].tolist(), strict=True):
            e = f"{prefix}.experts.{expert}"
            gate, up = x[token] @ tensors[f"{e}.gate_proj.weight"].T, x[token] @ tensors[f"{e}.up_proj.weight"].T
            out[token] += weight * ((torch.nn.functional.silu(gate) * up) @ tensors[f"{e}.down_proj.weight"].T)
    return out


@pytest.mark.slow
def test_moe_port_is_mixture_of_experts_as_vllms_qwen3_moe(workdir):
    import torch

    from scaffold.tiny import build_tiny

    ref = build_tiny("qwen3_moe", workdir / "ckpt-eplb-ref", architecture="Qwen3MoeForCausalLM", seed=5,
                     overrides={"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                "norm_topk_prob": True, "mlp_only_layers": [1]})
    ckpt = with_architecture(ref, workdir / "ckpt-eplb-port", "EplbQwen3MoeForCausalLM")
    out = workdir / "port-eplb"
    scaffold("new", ckpt, "-o", out, "--force")
    probe = run({"mode": "moe", "checkpoint": str(ref), "redundant": 2}, workdir / "probe-eplb", port=out)

    attributes = probe["attributes"]
    assert attributes["port"] == attributes["vllm"]
    # Two MoE layers (layer 1 keeps a dense MLP), 4 logical experts and 2 replicas on one rank.
    assert attributes["port"]["num_moe_layers"] == 2 and attributes["port"]["num_physical_experts"] == 6
    assert probe["is_mixture_of_experts"] == {"vllm": True, "port": True}
    # Every parameter the same after loading: physical experts 4 and 5 hold replicas of logical
    # experts 0 and 1, which a loader that maps each checkpoint expert to one slot leaves empty.
    assert probe["only_one_side"] == [] and probe["differing"] == []
    assert probe["expert_weights"]["port"] == probe["expert_weights"]["vllm"]
    assert probe["expert_weights"]["port"][0][0][0] == 6
    assert probe["expert_weights_equal"]
    mine, theirs = (torch.tensor(probe["block"][side]) for side in ("port", "vllm"))
    expected = moe_reference(ref, probe["hidden"])
    print(f"MoE block under EPLB: port vs vLLM's Qwen3MoeForCausalLM max |d| {(mine - theirs).abs().max():.3g}, "
          f"vs the checkpoint's routing {(mine - expected).abs().max():.3g}")
    assert expected.abs().max() > 1e-3, "the reference block output is ~0: the check would pass on anything"
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    torch.testing.assert_close(mine, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.engine
def test_eagle3_aux_hidden_states_match_vllms_llama(workdir):
    import torch

    from scaffold.tiny import build_tiny

    ref = build_tiny("llama", workdir / "ckpt-eagle3-ref", architecture="LlamaForCausalLM", seed=7,
                     overrides={"num_hidden_layers": 4})
    ckpt = with_architecture(ref, workdir / "ckpt-eagle3-port", "Eagle3LlamaPortForCausalLM")
    out = workdir / "port-eagle3"
    scaffold("new", ckpt, "-o", out, "--force")
    # The embeddings (0), a middle layer's input and the last layer's output (4).
    request = {"mode": "eagle3", "prompt": PROMPT, "layers": [0, 2, 4]}
    mine = run({**request, "checkpoint": str(ckpt)}, workdir / "probe-eagle3-port", port=out)
    theirs = run({**request, "checkpoint": str(ref)}, workdir / "probe-eagle3-ref")
    assert mine["model_class"].endswith(".model.Eagle3LlamaPortForCausalLM")
    assert theirs["model_class"] == "vllm.model_executor.models.llama.LlamaForCausalLM"
    assert mine["default_layers"] == theirs["default_layers"]
    assert len(mine["aux"]) == len(theirs["aux"]) == 3
    for layer, a, b in zip(request["layers"], mine["aux"], theirs["aux"], strict=True):
        a, b = torch.tensor(a), torch.tensor(b)
        assert a.shape == (len(PROMPT), 128), a.shape
        print(f"aux hidden states entering layer {layer}: max |d| {(a - b).abs().max():.3g}")
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # Distinct layers give distinct states: the port did not return one tensor three times.
    assert not torch.allclose(torch.tensor(mine["aux"][0]), torch.tensor(mine["aux"][2]))


@pytest.mark.engine
@pytest.mark.extended  # the full suite checks the aux hidden states EAGLE-3 reads (above)
def test_eagle3_speculative_decoding_serves_the_port_as_vllms_llama(workdir):
    from scaffold.tiny import build_tiny

    ref = build_tiny("llama", workdir / "ckpt-eagle3-ref", architecture="LlamaForCausalLM", seed=7,
                     overrides={"num_hidden_layers": 4})
    ckpt = with_architecture(ref, workdir / "ckpt-eagle3-port", "Eagle3LlamaPortForCausalLM")
    out = workdir / "port-eagle3"
    scaffold("new", ckpt, "-o", out, "--force")
    draft = eagle3_drafter(ref, workdir / "eagle3-drafter", layers=[0, 2, 4])
    request = {"mode": "eagle3_speculative", "prompt": PROMPT, "max_tokens": 24, "draft": str(draft)}
    mine = run({**request, "checkpoint": str(ckpt)}, workdir / "probe-eagle3-spec-port", port=out)
    theirs = run({**request, "checkpoint": str(ref)}, workdir / "probe-eagle3-spec-ref")
    assert mine["model_class"].endswith(".model.Eagle3LlamaPortForCausalLM")
    print(f"EAGLE-3 through the port: {mine['spec_decode']}; vLLM's Llama: {theirs['spec_decode']}")
    assert mine["spec_decode"]["num_drafts"] > 0, "no token was drafted: speculative decoding did not run"
    assert mine["tokens"] == theirs["tokens"] and len(mine["tokens"]) == 24
    assert mine["spec_decode"] == theirs["spec_decode"]
