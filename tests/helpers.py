"""Helpers shared by the test files (imported as `from helpers import ...`; conftest keeps only fixtures).

Also the golden ports: which checkpoints they are generated from, how, and how the generated
text is normalized so that the committed copies under tests/golden/ are the same on every
machine and clone. tests/test_golden.py diffs against them; scripts/update_golden.py rewrites them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
GOLDEN = REPO / "tests" / "golden"


def scaffold(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed CLI the way a user does."""
    proc = subprocess.run([sys.executable, "-m", "scaffold.cli", *map(str, args)], check=False, capture_output=True,
                          text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"scaffold {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def quick_sample(values, *, every: int | None = None, ids=None, keep: tuple = ()) -> list:
    """pytest parameters for a test whose cases each start the CLI in a subprocess (a second or more
    apiece): every `every`-th case (the first included), and those whose id is in `keep`, stay in the
    quick tier; the others are marked slow. The full suite runs every case."""
    values = list(values)
    ids = list(ids) if ids is not None else [str(v) for v in values]
    return [pytest.param(v, id=i, marks=() if (every and n % every == 0) or i in keep else pytest.mark.slow)
            for n, (v, i) in enumerate(zip(values, ids))]


def engine_sample(values, *, keep, ids=None) -> list:
    """pytest parameters for an engine test with many cases of the same kind (some 20 s apiece): those whose
    id is in `keep` run in the full suite, chosen so that each template path and check stays covered; the
    others are marked `extended` (`pytest -m extended` runs them, and the scripts that write documents from
    them). A tuple value is one case of several arguments, its id the values joined by '-'. Every id in
    `keep` must be a case: a sample that names a removed case fails at collection."""
    values = list(values)
    ids = list(ids) if ids is not None else ["-".join(v) if isinstance(v, tuple) else str(v) for v in values]
    if missing := set(keep) - set(ids):
        raise ValueError(f"engine_sample keeps cases that do not exist: {sorted(missing)}")
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), id=i,
                         marks=() if i in keep else pytest.mark.extended) for v, i in zip(values, ids)]


def transformers_code(model: str) -> dict[str, str]:
    """The installed transformers' modeling file of `model`, as sources for the detectors (read, never imported)."""
    root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))
    path = root / "models" / model / f"modeling_{model}.py"
    return {path.name: path.read_text(encoding="utf-8")}


# The start of a lab-style modeling file the detector tests write (imports, a NeoX rotate_half and its
# application, an RMSNorm class): the attention and layer classes under test follow it.
LAB_PRELUDE = """import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LabRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


"""

# The rest of a lab's Llama-like decoder, after its attention class LabAttention(config, layer_idx): the tests
# that read one form of the attention share it (LabRMSNorm comes from LAB_PRELUDE).
LAB_DECODER = """class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = LabAttention(config, layer_idx)
        self.mlp = LabMLP(config)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
"""

PARITY_TOLERANCE = 1e-4  # float32, max |Δ log-prob| over the top-20 tokens at every position


def own_weight_tests_pass(port: Path, at_least: int = 7) -> str:
    """The port's own generated tests/test_weight_mapping.py must pass, run against vLLM with the port installed
    into a private folder (as a user runs them after `pip install`). Returns pytest's summary line."""
    import re

    from scaffold.verify.port import load_port, stage_install

    loaded = load_port(port)
    stage = stage_install(loaded)
    try:
        env = dict(os.environ, PYTHONPATH=str(stage), VLLM_PLUGINS=loaded.spec.package)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(port / "tests" / "test_weight_mapping.py")],
                              check=False, capture_output=True, text=True, env=env, cwd=port, timeout=900)
    finally:
        shutil.rmtree(stage.parent, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= at_least and "failed" not in summary and "error" not in summary, summary
    return summary


def verified_at_parity(port: Path, *args: str) -> dict:
    """`scaffold verify PORT --json ARGS` must pass: the port loads in vLLM, log-probabilities within
    PARITY_TOLERANCE, identical greedy continuations. Returns the checks by name."""
    proc = scaffold("verify", port, "--json", *args, check=False)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["port loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["max_delta"] <= PARITY_TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    return checks


# ------------------------------------------------------------------ real remote-code models
# Third-party remote-code models (../shared/realmodels, beside the clone): their sources stay there, under
# their own licenses; tests build tiny random-weight checkpoints from them at test time.
REALMODELS = Path(os.environ.get("SCAFFOLD_REALMODELS", REPO.parent / "shared" / "realmodels"))
REALMODEL_NAMES = ("internlm2", "qwen", "baichuan2", "chatglm2")


def build_realmodel(name: str, out: Path) -> Path:
    """Build ../shared/realmodels' `name` into out/name with its own build.py; the checkpoint folder."""
    script = REALMODELS / "build.py"
    if not script.is_file():
        raise AssertionError(f"{script} is missing: the real remote-code models live in ../shared/realmodels "
                             "beside the clone (or set SCAFFOLD_REALMODELS)")
    proc = subprocess.run([sys.executable, str(script), name], env={**os.environ, "REALMODELS_OUT": str(out)},
                          cwd=out, check=False, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"building {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return out / name


# ------------------------------------------------------------------ golden ports
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# Stands for the checkpoint's absolute path, which the port records (scaffold_spec.toml, REVIEW.md,
# the generated tests' conftest) and which differs per clone and per tmp folder.
CHECKPOINT_PLACEHOLDER = "<CHECKPOINT>"


@dataclass(frozen=True)
class GoldenPort:
    """One golden port: a shipped example, or a tiny checkpoint built from a transformers family."""

    name: str
    example: str | None = None  # a folder under examples/
    model_type: str | None = None  # else a transformers model_type for scaffold.tiny.build_tiny
    architecture: str | None = None  # renamed so that vLLM has no class of its own for it
    overrides: dict = field(default_factory=dict)
    new_args: tuple[str, ...] = ()  # extra `scaffold new` arguments


GOLDEN_PORTS = {p.name: p for p in (
    GoldenPort("demolm", example="demolm"),  # remote-code Llama variant: gating bias, sliding window, rope default
    # Served by the transformers backend (asked for: the native generator ports its 3-D experts too).
    GoldenPort("tinymoe", example="tinymoe", new_args=("--trust-remote-code", "--impl", "transformers")),
    # The same remote code ported natively: experts stored as one 3-D tensor per projection.
    GoldenPort("tinymoe_native", example="tinymoe", new_args=("--impl", "native")),
    GoldenPort("llama", model_type="llama", architecture="GoldenLlamaForCausalLM"),
    # The fused-layout family: the checkpoint stores qkv_proj and gate_up_proj already fused.
    GoldenPort("phi3", model_type="phi3", architecture="GoldenPhi3ForCausalLM", overrides=TOKENS),
    GoldenPort("qwen2_moe", model_type="qwen2_moe", architecture="GoldenQwen2MoeForCausalLM",
               overrides={"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                          "shared_expert_intermediate_size": 96}),
    GoldenPort("gemma2", model_type="gemma2", architecture="GoldenGemma2ForCausalLM",
               overrides={"sliding_window": 8, "query_pre_attn_scalar": 48, "attn_logit_softcapping": 1.0,
                          "final_logit_softcapping": 1.0}),
    # Multi-head latent attention with DeepSeek-V3's routing (sigmoid, correction bias, groups, shared expert).
    GoldenPort("deepseek_v3", model_type="deepseek_v3", architecture="GoldenDeepseekV3ForCausalLM",
               overrides={"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64, "q_lora_rank": 96,
                          "qk_nope_head_dim": 32, "v_head_dim": 32, "num_key_value_heads": 4, "n_routed_experts": 4,
                          "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_group": 2, "topk_group": 1,
                          "first_k_dense_replace": 1}),
)}


# The checkpoints sit in a folder whose absolute path has this length on every machine: ruff wraps the
# generated lines that hold the path by its length, so only a path of fixed length gives the same port
# everywhere once the path itself is replaced by the placeholder.
GOLDEN_ROOT_LENGTH = len("/tmp/scaffold-golden-12345678")


@contextlib.contextmanager
def golden_workdir():
    """A fresh /tmp/scaffold-golden-XXXXXXXX folder, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="scaffold-golden-", dir="/tmp")).resolve()
    try:
        if len(str(root)) != GOLDEN_ROOT_LENGTH:
            raise RuntimeError(f"golden ports need a work folder path of {GOLDEN_ROOT_LENGTH} characters, "
                               f"got {root} (is /tmp a symlink here?)")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def golden_checkpoint(port: GoldenPort, workdir: Path) -> Path:
    """The checkpoint a golden port is generated from, at workdir/<port name> (see golden_workdir).

    Examples are copied there; tiny checkpoints are built there with a fixed seed (only their
    headers and config matter to `scaffold new`, and those do not depend on the weights' values).
    """
    target = Path(workdir) / port.name
    if port.example:
        shutil.copytree(EXAMPLES / port.example, target)
        return target
    from scaffold.tiny import build_tiny

    return build_tiny(port.model_type, target, architecture=port.architecture, overrides=port.overrides, seed=0)


def normalize(text: str, checkpoint: Path) -> str:
    return text.replace(str(checkpoint), CHECKPOINT_PLACEHOLDER)


def generate_golden(port: GoldenPort, checkpoint: Path, out: Path) -> dict[str, str]:
    """Run `scaffold new` on the checkpoint into `out`; every file it wrote, relative path -> normalized text."""
    scaffold("new", checkpoint, "-o", out, "--force", *port.new_args)
    return {path.relative_to(out).as_posix(): normalize(path.read_text(encoding="utf-8"), checkpoint)
            for path in sorted(out.rglob("*")) if path.is_file()}


def read_golden(name: str) -> dict[str, str]:
    root = GOLDEN / name
    return {path.relative_to(root).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted(root.rglob("*")) if path.is_file()}


def write_golden(name: str, files: dict[str, str]) -> None:
    """Replace tests/golden/<name>/ with exactly these files."""
    root = GOLDEN / name
    if root.exists():
        shutil.rmtree(root)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")



# ------------------------------------------------------------------ unit tier
def fused_tensors(shape) -> dict[str, list[int]]:
    """A Phi-3-style layout of a ckpt_factory Shape: one qkv_proj and one gate_up_proj tensor per layer."""
    from ckpt_factory import tensors_for

    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out = {}
    for name, dims in tensors_for(shape).items():
        if name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")) and ".gate_up_" not in name:
            continue
        if name.endswith("q_proj.weight"):
            out[name.replace("q_proj", "qkv_proj")] = [q + 2 * kv, shape.hidden]
        elif name.endswith("gate_proj.weight"):
            out[name.replace("gate_proj", "gate_up_proj")] = [2 * shape.intermediate, shape.hidden]
        else:
            out[name] = dims
    return out


def read(root: Path, shape=None, **write_args):
    """Write a ckpt_factory checkpoint into `root` (a Llama Shape unless given) and read it back."""
    from ckpt_factory import Shape, write_checkpoint

    from scaffold.checkpoint import read_checkpoint

    write_checkpoint(root, shape or Shape(), **write_args)
    return read_checkpoint(root)


def detect_until(ckpt, last):
    """The spec after running the detectors in their pipeline order, up to and including module `last`."""
    from scaffold.detect import DETECTORS
    from scaffold.spec import Spec

    spec = Spec()
    for detector in DETECTORS:
        detector.detect(ckpt, spec)
        if detector is last:
            return spec
    raise ValueError(f"{last.__name__} is not one of the pipeline's detectors")


def moe_tensors(shape, *, experts: int, inter: int, shared: int = 0, dense_layers=()) -> dict[str, list[int]]:
    """A Qwen2-MoE layout of a ckpt_factory Shape: in every layer not in dense_layers, a router
    (mlp.gate), `experts` gated experts of size `inter` and, when `shared`, a shared expert and its gate."""
    from ckpt_factory import tensors_for

    h = shape.hidden
    out = {}
    for name, dims in tensors_for(shape).items():
        parts = name.split(".")
        if ".mlp." not in name or int(parts[2]) in dense_layers:
            out[name] = dims
            continue
        if not name.endswith("mlp.gate_proj.weight"):
            continue  # the dense projections of a sparse layer are replaced by what follows
        mlp = ".".join(parts[:4])
        out[f"{mlp}.gate.weight"] = [experts, h]
        for e in range(experts):
            out[f"{mlp}.experts.{e}.gate_proj.weight"] = [inter, h]
            out[f"{mlp}.experts.{e}.up_proj.weight"] = [inter, h]
            out[f"{mlp}.experts.{e}.down_proj.weight"] = [h, inter]
        if shared:
            out[f"{mlp}.shared_expert.gate_proj.weight"] = [shared, h]
            out[f"{mlp}.shared_expert.up_proj.weight"] = [shared, h]
            out[f"{mlp}.shared_expert.down_proj.weight"] = [h, shared]
            out[f"{mlp}.shared_expert_gate.weight"] = [1, h]
    return out
