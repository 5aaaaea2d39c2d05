"""The checkpoint this package serves, and one engine start through the transformers backend."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKPOINT = Path(
    os.environ.get("SCAFFOLD_CHECKPOINT", "<CHECKPOINT>")
)
PACKAGE_DIR = Path(__file__).resolve().parent.parent

# Runs in its own process: building the backend rewrites transformers' classes in the
# process that builds it, and vLLM logs its `Fused:` lines to stdout.
ENGINE_SCRIPT = """
import sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
sys.path.insert(0, sys.argv[2])
from tiny_mo_e_vllm import engine_kwargs

llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
          max_model_len=128, seed=0, **engine_kwargs())
out = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3, 4])], SamplingParams(max_tokens=2, detokenize=False),
                   use_tqdm=False)
print("generated", list(out[0].outputs[0].token_ids))
"""


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").exists():
        pytest.skip(f"checkpoint not found at {CHECKPOINT}; set SCAFFOLD_CHECKPOINT")
    return CHECKPOINT


@pytest.fixture(scope="session")
def engine_log(checkpoint) -> str:
    """Everything the engine printed while loading the checkpoint and generating two tokens."""
    pytest.importorskip("vllm")
    env = dict(
        os.environ,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_PLUGINS="",
        VLLM_LOGGING_LEVEL="INFO",
    )
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    proc = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(checkpoint), str(PACKAGE_DIR)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log
