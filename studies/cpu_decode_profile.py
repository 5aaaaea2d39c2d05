"""Where a decode-heavy run spends its time, for vLLM's own class or the transformers backend.

Serves CHECKPOINT (its config.json's `architectures` replaced by ARCH in a view of symlinks)
with model_impl="vllm" (native) or "transformers" (backend), bf16, compiled mode; times five
decode-heavy runs (16 random prompts of 16 tokens, 64 sampled tokens each) after a warm-up,
then prints torch.profiler's table of one more run, by self CPU time (ROWS rows, default 25).

    VLLM_CPU_KVCACHE_SPACE=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_PLUGINS= \\
        python studies/cpu_decode_profile.py native|backend CHECKPOINT ARCH
(for the port: PYTHONPATH=its pip --target folder, VLLM_PLUGINS=its package, impl "port", ARCH its name)
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from scaffold.bench import checkpoint_view


def main() -> None:
    impl, checkpoint, architecture = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model = checkpoint_view(checkpoint, architecture, Path(tempfile.mkdtemp(prefix="decode-profile-")))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    llm = LLM(model=str(model), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=512,
              model_impl="transformers" if impl == "backend" else "vllm", seed=0)
    rng = random.Random(0)

    def prompts():
        return [TokensPrompt(prompt_token_ids=[rng.randrange(vocab) for _ in range(16)]) for _ in range(16)]

    params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, detokenize=False)
    llm.generate(prompts(), params, use_tqdm=False)
    seconds = []
    for _ in range(5):
        started = time.perf_counter()
        llm.generate(prompts(), params, use_tqdm=False)
        seconds.append(time.perf_counter() - started)
    print(impl, "decode-heavy seconds", [round(s, 3) for s in seconds], flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(prompts(), params, use_tqdm=False)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=int(os.environ.get("ROWS", "25"))))


if __name__ == "__main__":
    main()
