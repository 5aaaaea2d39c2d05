"""What a port's vLLM interfaces hand vLLM, beside vLLM's own class on the same checkpoint, in a child process.

Usage: python interface_probe.py REQUEST.json. The request holds mode, checkpoint, out, and for
the port side `package` and `architecture` (the staged port is on PYTHONPATH; see run()).

- mode "eagle3" (SupportsEagle3): one engine serves the checkpoint; the model is told to return
  the auxiliary hidden states of `layers` (set_aux_hidden_state_layers, as EAGLE-3 does), and a
  forward hook keeps them and hands the engine the plain hidden states (without an EAGLE-3
  drafter the model runner expects those). Writes {"model_class", "default_layers", "aux"}:
  the hidden states of the prompt's tokens at each layer, as lists.
- mode "eagle3_speculative": one engine serves the checkpoint with EAGLE-3 speculative decoding
  (the drafter at `draft` reads the auxiliary hidden states of the layers its config names).
  Writes {"model_class", "tokens", "spec_decode"}: the greedy continuation of `prompt` and the
  engine's speculative-decoding counters (drafts, draft tokens, accepted tokens).
- mode "moe" (MixtureOfExperts): no engine. vLLM's own Qwen3MoeForCausalLM and the port's class
  are built in this process on the same config with expert-parallel load balancing on and
  `redundant` redundant experts (vLLM's CPU build refuses enable_eplb when it makes the config,
  so it is switched on after), both loaded from the checkpoint by their own load_weights and
  vLLM's post-load processing, both given vLLM's own EplbState (add_model), and one MoE block
  of each run on the same hidden states. Writes the interface's attributes of both, the
  parameters where they differ, the expert weights EPLB would move, and both blocks' outputs.
- mode "names": no engine. The port's class is built in this process on the checkpoint's config,
  with an FP8 quantization config whose ignored_layers are `ignored` (module names as the
  checkpoint gives them). Writes, for every linear layer, its place in the module tree, the prefix
  it was built with and its quantization method's class, and for every attention layer the name
  vLLM binds its KV cache by and the layer index vLLM's binding reads from it.
- mode "routing": no engine. The port's class is built in this process on the checkpoint's config
  and loaded from it (its load_weights and vLLM's post-load processing), and the MoE block of
  layer `layer` is run on `tokens` random hidden states, every torch.topk call counted. Writes the
  hidden states, the block's output and the shapes torch.topk was called on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MOE_ATTRIBUTES = ("num_moe_layers", "num_expert_groups", "num_logical_experts", "num_physical_experts",
                  "num_local_physical_experts", "num_routed_experts", "num_shared_experts", "num_redundant_experts")


def run(request: dict, workdir: Path, port: Path | None = None) -> dict:
    """Run one probe in a child process (the port, if given, staged as verify stages it)."""
    from scaffold.verify.parity import engine_env
    from scaffold.verify.port import load_port, stage_install

    workdir.mkdir(parents=True, exist_ok=True)
    stage = package = None
    if port is not None:
        loaded = load_port(port, request["checkpoint"])
        stage, package = stage_install(loaded), loaded.spec.package
        request = {**request, "package": package, "architecture": loaded.spec.architecture}
    request = {**request, "out": str(workdir / "probe.json")}
    (workdir / "request.json").write_text(json.dumps(request))
    proc = subprocess.run([sys.executable, __file__, str(workdir / "request.json")], cwd=workdir,
                          env=engine_env(stage, package), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"the {request['mode']} probe failed on {request['checkpoint']}:\n{proc.stderr[-3000:]}")
    return json.loads(Path(request["out"]).read_text())


def eagle3(request: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=request["checkpoint"], skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=128, seed=0, enable_prefix_caching=False)
    captured: list[list] = []

    def listen(model):
        model.set_aux_hidden_state_layers(tuple(request["layers"]))

        def keep_aux(module, args, output):
            hidden_states, aux = output
            captured.append([t.tolist() for t in aux])
            return hidden_states

        # On the causal LM: the inner model's torch.compile wrapper calls forward without hooks.
        model.register_forward_hook(keep_aux)
        return f"{type(model).__module__}.{type(model).__qualname__}", model.get_eagle3_default_aux_hidden_state_layers()

    ((model_class, default_layers),) = llm.apply_model(listen)
    llm.generate([TokensPrompt(prompt_token_ids=request["prompt"])],
                 SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), use_tqdm=False)
    # The first forward is the prompt's (prefill): one row per prompt token.
    return {"model_class": model_class, "default_layers": list(default_layers), "aux": captured[0]}


def eagle3_speculative(request: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=request["checkpoint"], skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=128, seed=0, enable_prefix_caching=False, disable_log_stats=False,
              speculative_config={"method": "eagle3", "model": request["draft"], "num_speculative_tokens": 2})
    (output,) = llm.generate([TokensPrompt(prompt_token_ids=request["prompt"])],
                             SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True,
                                            detokenize=False),
                             use_tqdm=False)
    counters = {m.name.removeprefix("vllm:spec_decode_"): getattr(m, "values", getattr(m, "value", None))
                for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_")}
    model_class = llm.apply_model(lambda model: f"{type(model).__module__}.{type(model).__qualname__}")[0]
    return {"model_class": model_class, "tokens": list(output.outputs[0].token_ids), "spec_decode": counters}


def moe(request: dict) -> dict:
    import glob
    import importlib
    import socket

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.eplb.eplb_state import EplbState
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.model_executor.models.interfaces import is_mixture_of_experts
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

    checkpoint = request["checkpoint"]
    config = EngineArgs(model=checkpoint, dtype="float32", skip_tokenizer_init=True, max_model_len=128,
                        enforce_eager=True).create_engine_config()
    parallel = config.parallel_config
    parallel.enable_eplb = True
    parallel.eplb_config.num_redundant_experts = request["redundant"]
    parallel.eplb_config.communicator = "torch_gloo"
    port_class = getattr(importlib.import_module(f"{request['package']}.model"), request["architecture"])
    files = sorted(glob.glob(f"{checkpoint}/*.safetensors"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    models = {}
    with set_current_vllm_config(config), torch.device("cpu"):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=address,
                                     backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        # Distinct prefixes: vLLM registers every attention and MoE layer under its name.
        for side, cls, prefix in (("vllm", Qwen3MoeForCausalLM, ""), ("port", port_class, "port")):
            model = cls(vllm_config=config, prefix=prefix)
            model.load_weights(safetensors_weights_iterator(files, False))
            process_weights_after_loading(model, config.model_config, torch.device("cpu"))
            EplbState(parallel, torch.device("cpu")).add_model(model, config.model_config, model_name=side)
            models[side] = model
        theirs, mine = (dict(models[side].named_parameters()) for side in ("vllm", "port"))
        torch.manual_seed(0)
        hidden = torch.randn(7, config.model_config.hf_config.hidden_size)
        with set_forward_context(None, config):
            block = {side: m.model.layers[0].mlp(hidden.clone()) for side, m in models.items()}
    return {
        "attributes": {side: {a: getattr(m, a) for a in MOE_ATTRIBUTES} for side, m in models.items()},
        "is_mixture_of_experts": {side: is_mixture_of_experts(m) for side, m in models.items()},
        "only_one_side": sorted(set(theirs) ^ set(mine)),
        "differing": sorted(n for n in theirs.keys() & mine.keys() if not torch.equal(theirs[n], mine[n])),
        "expert_weights": {side: [[list(t.shape) for t in layer] for layer in m.expert_weights]
                           for side, m in models.items()},
        "expert_weights_equal": all(torch.equal(a, b) for la, lb in zip(models["vllm"].expert_weights,
                                                                         models["port"].expert_weights, strict=True)
                                    for a, b in zip(la, lb, strict=True)),
        "hidden": hidden.tolist(),
        "block": {side: out.tolist() for side, out in block.items()},
    }


def names(request: dict) -> dict:
    import importlib
    import socket

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.models.utils import extract_layer_index

    config = EngineArgs(model=request["checkpoint"], dtype="float32", skip_tokenizer_init=True, max_model_len=128,
                        enforce_eager=True).create_engine_config()
    # Only built, never loaded nor run: the quantization methods each linear layer gets are what is read.
    config.quant_config = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                                    ignored_layers=request["ignored"])
    port_class = getattr(importlib.import_module(f"{request['package']}.model"), request["architecture"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    with set_current_vllm_config(config), torch.device("cpu"):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=address,
                                     backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        model = port_class(vllm_config=config, prefix="")
    modules = dict(model.named_modules())
    return {
        "linears": {name: {"prefix": m.prefix, "method": type(m.quant_method).__name__}
                    for name, m in modules.items() if isinstance(m, LinearBase)},
        "attention": {name: {"layer_name": m.layer_name, "index": extract_layer_index(m.layer_name)}
                      for name, m in modules.items() if isinstance(m, AttentionLayerBase)},
    }


def routing(request: dict) -> dict:
    import glob
    import importlib
    import socket

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    checkpoint = request["checkpoint"]
    config = EngineArgs(model=checkpoint, dtype="float32", skip_tokenizer_init=True, max_model_len=128,
                        enforce_eager=True).create_engine_config()
    port_class = getattr(importlib.import_module(f"{request['package']}.model"), request["architecture"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    topk_calls: list[list[int]] = []
    topk = torch.topk

    def counted_topk(input, *args, **kwargs):
        topk_calls.append(list(input.shape))
        return topk(input, *args, **kwargs)

    with set_current_vllm_config(config), torch.device("cpu"):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=address,
                                     backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        model = port_class(vllm_config=config, prefix="")
        model.load_weights(safetensors_weights_iterator(sorted(glob.glob(f"{checkpoint}/*.safetensors")), False))
        process_weights_after_loading(model, config.model_config, torch.device("cpu"))
        torch.manual_seed(0)
        hidden = torch.randn(request["tokens"], config.model_config.hf_config.hidden_size)
        torch.topk = counted_topk
        try:
            with set_forward_context(None, config):
                out = model.model.layers[request["layer"]].mlp(hidden.clone())
        finally:
            torch.topk = topk
    return {"hidden": hidden.tolist(), "block": out.tolist(), "topk_calls": topk_calls}


def main(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    result = {"eagle3": eagle3, "eagle3_speculative": eagle3_speculative, "moe": moe,
              "names": names, "routing": routing}[request["mode"]](request)
    Path(request["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
