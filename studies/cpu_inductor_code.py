"""The inductor code vLLM's CPU build compiles for one model: what runs inside the compiled graph.

Serves CHECKPOINT (its config.json's `architectures` replaced by ARCH in a view of symlinks)
with model_impl="vllm" (native or, through its plugin, the port) or "transformers" (backend),
bf16, compiled mode, and generates two tokens. With the environment below, torch logs the
generated code to stderr; `call(...)` in it is the graph's whole forward (the fused C++
kernels, the oneDNN matmuls, the attention ops).

    VLLM_DISABLE_COMPILE_CACHE=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TORCH_LOGS=output_code \\
    VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_PLUGINS= \\
        python studies/cpu_inductor_code.py native|backend CHECKPOINT ARCH 2> code.log
(for the port: PYTHONPATH=its pip --target folder, VLLM_PLUGINS=its package, impl "port", ARCH its name)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from scaffold.bench import checkpoint_view


def main() -> None:
    impl, checkpoint, architecture = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    view = checkpoint_view(checkpoint, architecture, Path(tempfile.mkdtemp(prefix="inductor-code-")))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(view), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
              model_impl="transformers" if impl == "backend" else "vllm", seed=0)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=2), use_tqdm=False)
    print("served", impl, architecture)


if __name__ == "__main__":
    main()
