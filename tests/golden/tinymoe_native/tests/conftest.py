"""Shared fixtures: the checkpoint this port was generated from and one vLLM engine."""

import os
from pathlib import Path

import pytest

CHECKPOINT = Path(
    os.environ.get(
        "SCAFFOLD_CHECKPOINT", "<CHECKPOINT>"
    )
)
PORT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").exists():
        pytest.skip(f"checkpoint not found at {CHECKPOINT}; set SCAFFOLD_CHECKPOINT")
    return CHECKPOINT


@pytest.fixture(scope="session")
def llm(checkpoint):
    """The port inside a real vLLM engine, loaded through the plugin entry point."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    return LLM(
        model=str(checkpoint),
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        seed=0,
    )


@pytest.fixture(scope="session")
def on_fresh_model(llm):
    """on_fresh_model(fn) runs fn(model) in the engine's worker on a new, unloaded port instance.

    The engine's own model has been through vLLM's post-load processing, which may
    repack weights for the platform; the mapping tests load a fresh instance with the
    port's load_weights and look at the parameters exactly as the loaders left them.
    """
    import itertools

    from vllm.config import set_current_vllm_config

    vllm_config = llm.llm_engine.vllm_config
    counter = itertools.count()

    def run(fn):
        def build(model):
            with set_current_vllm_config(vllm_config):
                fresh = type(model)(
                    vllm_config=vllm_config, prefix=f"mapping_check_{next(counter)}"
                )
            return fn(fresh)

        (result,) = llm.apply_model(build)
        return result

    return run
