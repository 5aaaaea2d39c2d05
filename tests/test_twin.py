"""`scaffold verify --twin`: a checkpoint too large for this machine, verified through a shrunk random twin.

The "large" checkpoint has Qwen3-4B's shape (36 layers, hidden 2560, 8 GB of bf16 weights)
but is sparse: real config.json, index and shard headers, holes for the data
(benchmarks/checkpoints.py). Its data must never be read: static checks run on its
headers, parity on the twin. A Qwen3-235B-A22B-shaped mixture of experts (94 layers,
128 experts, 118 shards) goes the same way. Three engine runs in all (the second reuses
the cached twin and its transformers reference).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, REPO, scaffold

from scaffold.errors import ScaffoldError
from scaffold.verify.twin import HEAD_DIMS, VOCAB, plan_twin

sys.path.insert(0, str(REPO / "benchmarks"))
from checkpoints import QWEN3_4B, QWEN3_235B_A22B, decoder_tensors, write_sparse

TOLERANCE = 1e-4
ARCH = "ScaffoldBigQwen3ForCausalLM"
# The verify CLI, reporting at exit its /proc/self/io, which includes every child it reaped.
WITH_IO = ("import atexit, sys\n"
           "atexit.register(lambda: sys.stderr.write('PROC-IO ' + open('/proc/self/io').read().replace(chr(10), ' ')"
           " + chr(10)))\n"
           "from scaffold.cli import main\n"
           "sys.argv[0] = 'scaffold'\n"
           "main()\n")


# ------------------------------------------------------------------ the shrinking table, no engine
def test_twin_keeps_layer_patterns_and_conventions():
    config = {
        "model_type": "gemma3_text", "architectures": ["X"], "num_hidden_layers": 26, "hidden_size": 1152,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912,
        "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512, "sliding_window_pattern": 6,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4 + ["sliding_attention"] * 2,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 256, "final_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": [1, 106],
        "pad_token_id": 0, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
    }
    plan = plan_twin(config)
    twin = plan.config
    assert twin["num_hidden_layers"] == 6  # the first full-attention layer is layer 5
    assert twin["layer_types"] == config["layer_types"][:6]
    assert twin["num_attention_heads"] // twin["num_key_value_heads"] == 4 and twin["head_dim"] >= HEAD_DIMS[0]
    assert twin["vocab_size"] == VOCAB and twin["sliding_window"] == 8
    assert all(v < VOCAB for v in [twin["bos_token_id"], twin["pad_token_id"], *twin["eos_token_id"]])
    untouched = {k for k in config if k not in plan.changes}
    assert {"rope_theta", "rope_local_base_freq", "query_pre_attn_scalar", "rms_norm_eps", "tie_word_embeddings",
            "hidden_activation", "architectures", "model_type"} <= untouched
    assert all(twin[k] == config[k] for k in untouched)


def test_twin_covers_sparse_steps_dense_prefix_and_mlp_only_layers():
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
              "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 2, "mlp_only_layers": [0, 1, 30],
              "first_k_dense_replace": 3, "no_rope_layers": [1, 1, 1, 0] * 12, "vocab_size": 151936}
    twin = plan_twin(config).config
    # Layer 30 is the only MLP-only layer past the dense prefix: a prefix that holds it has 31 layers.
    assert twin["num_hidden_layers"] == 31 and twin["mlp_only_layers"] == [0, 1, 30]
    assert twin["no_rope_layers"] == config["no_rope_layers"][:31]
    twin = plan_twin({**config, "mlp_only_layers": [0, 1]}).config
    # Patterns: dense below 3, sparse step 2, MLP-only 0 and 1, no rope every fourth layer; layer 5 is the
    # first odd layer past the dense prefix that uses rotary.
    assert twin["num_hidden_layers"] == 6
    assert twin["mlp_only_layers"] == [0, 1] and twin["no_rope_layers"] == [1, 1, 1, 0, 1, 1]
    assert (twin["num_experts"], twin["num_experts_per_tok"], twin["moe_intermediate_size"]) == (4, 2, 64)
    assert twin["decoder_sparse_step"] == 2 and twin["first_k_dense_replace"] == 3


def test_twin_shrinks_per_layer_head_counts_with_the_model():
    """Laguna's num_attention_heads_per_layer: each layer's GQA ratio is kept over the twin's KV heads (a list
    left at the real counts would build a twin as wide as the real attention)."""
    config = {"model_type": "laguna", "num_hidden_layers": 40, "hidden_size": 2048, "num_attention_heads": 48,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "vocab_size": 100352,
              "num_attention_heads_per_layer": [48, 64, 64, 64] * 10,
              "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"] * 10}
    plan = plan_twin(config)
    twin = plan.config
    assert (twin["num_attention_heads"], twin["num_key_value_heads"]) == (6, 1)
    assert twin["num_hidden_layers"] == 3 and twin["num_attention_heads_per_layer"] == [6, 8, 8]
    assert plan.changes["num_attention_heads_per_layer"] == [config["num_attention_heads_per_layer"], [6, 8, 8]]
    # Every head owns its KV head: the counts scale with the model's query heads.
    mha = plan_twin({**config, "num_key_value_heads": 48, "num_attention_heads_per_layer": [48, 96, 96, 96] * 10})
    assert mha.config["num_attention_heads"] == 4 and mha.config["num_attention_heads_per_layer"] == [4, 8, 8]
    # A layer whose heads are not whole groups over the KV heads is no model; the twin says so.
    with pytest.raises(ScaffoldError, match="num_attention_heads_per_layer: a layer's 60 query heads"):
        plan_twin({**config, "num_attention_heads_per_layer": [48, 60, 64, 64] * 10})


def test_twin_of_remote_code_checkpoint_keeps_its_code_and_layout(tmp_path):
    """demolm: custom code (auto_map), GQA 3:1, sliding window on two layers of three, a 250-token tokenizer."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.verify.twin import build_twin, info, layout_problems, twin_spec

    real = read_checkpoint(EXAMPLES / "demolm")
    twin = read_checkpoint(build_twin(real, tmp_path / "twin", trust_remote_code=True))
    assert set(twin.sources) == set(real.sources) and twin.tokenizer.vocab_size == real.tokenizer.vocab_size
    assert twin.config["architectures"] == real.config["architectures"] and twin.config["auto_map"] == real.config[
        "auto_map"]
    assert twin.config["layer_types"] == real.config["layer_types"][:3]
    real_spec, spec = detect(real), detect(twin)
    assert spec.sliding_window_layers == [0, 1] and spec.rope_parameters == real_spec.rope_parameters
    spec, unexpected = twin_spec(real_spec, real_spec, spec)
    assert not unexpected and spec.num_layers == 3
    assert layout_problems(real_spec, real, twin, spec) == ([], 33)
    assert "3 of 6 layers" in info(twin.path)["summary"]
    assert build_twin(real, tmp_path / "twin", trust_remote_code=True) == twin.path  # a complete twin is reused


@pytest.mark.slow  # ~15 s on 2 cores: builds the lab checkpoint and its twin with transformers
def test_twin_of_a_hash_routed_checkpoint_draws_its_integer_table(tmp_path):
    """The lab's hash routing (tests/hash_routing_ckpt.py): an int32 table of each token's experts, which the main
    reader lets through where the code indexes it by token id for experts. The twin is built from the checkpoint's
    path, keeps the table as integers and draws each row as distinct experts (transformers builds it as zeros: every
    token would go to expert 0 twice, and a port reading the table wrongly would pass)."""
    from hash_routing_ckpt import OVERRIDES, build

    from scaffold.detect import detect
    from scaffold.detect.forms import read_checkpoint
    from scaffold.verify.twin import build_twin

    real = build(tmp_path / "hashmoe")
    twin = read_checkpoint(build_twin(real, tmp_path / "twin", trust_remote_code=True))
    name = "model.layers.0.mlp.gate.expert_table"
    assert twin.tensors[name].dtype == "I32"
    assert twin.tensors[name].shape == (twin.config["vocab_size"], OVERRIDES["num_experts_per_tok"])
    real_spec, spec = detect(read_checkpoint(real)), detect(twin)
    assert spec.hash_layers == real_spec.hash_layers == [0] and spec.hash_table == real_spec.hash_table
    from safetensors import safe_open

    shard = twin.path / twin.tensors[name].file
    with safe_open(str(shard), "pt") as f:
        table = f.get_tensor(name)
    experts = twin.config["num_local_experts"]  # transformers 5 names Qwen3-MoE's num_experts so
    assert int(table.min()) >= 0 and int(table.max()) < experts
    assert all(len(set(row.tolist())) == table.shape[1] for row in table)  # distinct experts per token
    assert len({tuple(row.tolist()) for row in table}) > 1  # not one row for every token


def test_headers_only_reports_the_tied_data_comparison_as_not_run():
    from types import SimpleNamespace

    from scaffold.verify import _headers_only, static
    from scaffold.verify.report import Report

    compare = static._tensors_equal
    spec = SimpleNamespace(tie_word_embeddings=True, names={"lm_head": "lm_head", "model": "model",
                                                            "embed_tokens": "embed_tokens"})
    ckpt = SimpleNamespace(tensors={"lm_head.weight": None, "model.embed_tokens.weight": None})
    report = Report("port", "ckpt")
    with _headers_only(report):
        static.check_tied(report, spec, ckpt)  # would read both tensors without the guard
    assert static._tensors_equal is compare
    (check,) = report.checks
    assert check.status == "skipped" and "not compared" in check.detail and check.data["on"] == "checkpoint"


# ------------------------------------------------------------------ bad input, no engine
def test_twin_refuses_remote_code_without_consent(workdir):
    out = workdir / "port-demolm-twin-untrusted"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    proc = scaffold("verify", out, "--twin", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "config.json" in proc.stderr and "modeling_demolm.py" in proc.stderr
    assert "--trust-remote-code" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # ~13 s on 2 cores: generates a backend package first
def test_twin_refuses_backend_ports(tiny, workdir):
    out = workdir / "port-twin-backend"
    scaffold("new", tiny("llama", "LlamaForCausalLM"), "--impl", "transformers", "-o", out, "--force")
    proc = scaffold("verify", out, "--twin", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert str(out) in proc.stderr and "transformers backend" in proc.stderr


# ------------------------------------------------------------------ the large checkpoint, real engine
def resident_bytes(path: Path, start: int) -> int:
    """Bytes of `path` from `start` on that sit in the page cache (mincore): what anyone read, by read or mmap."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(vec[i] & 1 for i in range(start // mmap.PAGESIZE, pages)) * mmap.PAGESIZE


def data_start(shard: Path) -> int:
    with open(shard, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


@pytest.fixture(scope="module")
def big(workdir):
    """The sparse Qwen3-4B-shaped checkpoint and its generated port."""
    ckpt = write_sparse(workdir / "ckpt-big-qwen3", QWEN3_4B, shards=3, architecture=ARCH)
    shards = sorted(ckpt.glob("*.safetensors"))
    data = sum(p.stat().st_size - data_start(p) for p in shards)
    if sum(p.stat().st_blocks * 512 for p in shards) > data // 100:
        pytest.skip("this filesystem does not keep the checkpoint's holes sparse")
    # The page-cache probe sees reads: a control file, a few pages of its hole read.
    control = workdir / "sparse-control"
    with open(control, "wb") as f:
        f.truncate(64 * mmap.PAGESIZE)
    with open(control, "rb") as f:
        f.seek(16 * mmap.PAGESIZE)
        f.read(8 * mmap.PAGESIZE)
    if resident_bytes(control, 0) < 8 * mmap.PAGESIZE:
        pytest.skip("the page cache does not show reads of holes on this filesystem")
    port = workdir / "port-big-qwen3"
    scaffold("new", ckpt, "-o", port, "--force")
    return ckpt, shards, data, port


def verify_twin(port: Path, *args: str) -> tuple[int, dict, int]:
    """Run `scaffold verify PORT --twin --json`; the exit code, the report and the bytes its process tree read."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", WITH_IO, "verify", str(port), "--twin", "--json", *args],
                          check=False, capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    rchar = int(re.search(r"PROC-IO rchar: (\d+)", proc.stderr).group(1))
    return proc.returncode, json.loads(proc.stdout), rchar


@pytest.mark.engine
@pytest.mark.extended  # the full suite verifies the twin of the 235B-shaped MoE, and a wrong port's twin
def test_twin_verifies_a_checkpoint_without_reading_its_data(big):
    ckpt, shards, data, port = big
    rc, report, rchar = verify_twin(port)
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 0 and report["passed"], json.dumps(report, indent=2)
    assert report["checkpoint"] == str(ckpt)
    # Static checks: on the real checkpoint (all 36 layers), headers only.
    for name in ("mapping coverage", "per-shard shapes", "q/k/v and gate/up order", "vocabulary",
                 "tied embeddings", "rope parameters", "spec matches checkpoint"):
        assert checks[name]["status"] == "pass" and checks[name]["on"] == "checkpoint", checks[name]
    assert checks["mapping coverage"]["detail"].startswith(f"{len(decoder_tensors(QWEN3_4B))} tensors")
    assert "q 4096, k 1024, v 1024 rows (GQA 32:8)" in checks["per-shard shapes"]["detail"]
    # The twin: what it is and where it came from.
    twin = checks["twin"]
    assert "3 of 36 layers" in twin["detail"] and "hidden 128 (real 2560)" in twin["detail"]
    assert "heads 8:2 (real 32:8)" in twin["detail"] and str(ckpt / "config.json") in twin["detail"]
    assert checks["twin layout"]["status"] == "pass"
    # Sharding and parity: on the twin.
    assert checks["tensor-parallel sharding"]["status"] == "pass" and checks["tensor-parallel sharding"]["on"] == "twin"
    assert checks["tensor-parallel sharding"]["servable_at_checkpoint_sizes"] == [2, 4, 8]
    for name in ("port loaded by vLLM", "parity: log-probabilities", "parity: greedy continuation"):
        assert checks[name]["status"] == "pass" and checks[name]["on"] == "twin", checks[name]
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    print(f"twin parity: max |dlogp| {checks['parity: log-probabilities']['max_delta']:.2e}; "
          f"verify read {rchar / 2**20:.0f} MiB in all (its children included); checkpoint data {data / 2**30:.1f} GiB")
    # The real tensor data was never read: not by read() (the whole process tree read far less than it),
    # and not by mmap or read() at all (none of its pages are in the page cache, bar readahead after the header).
    assert rchar < data / 4
    for shard in shards:
        assert resident_bytes(shard, data_start(shard)) <= 2**20, shard


@pytest.mark.engine
def test_twin_catches_a_port_that_is_wrong(big, workdir):
    """rope_theta overridden in the port's model.py (which reads it from the config): the static checks cannot
    see it, parity on the twin does."""
    import shutil

    _, _, _, port = big
    mutant = workdir / "port-big-qwen3-mutant"
    shutil.rmtree(mutant, ignore_errors=True)
    shutil.copytree(port, mutant)
    model = next(mutant.glob("*/model.py"))
    text = model.read_text()
    read = "rope_parameters = config.rope_parameters"
    assert read in text
    model.write_text(text.replace(read, 'rope_parameters = {**config.rope_parameters, "rope_theta": 10000.0}'))
    rc, report, _ = verify_twin(mutant)
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and not report["passed"]
    assert checks["mapping coverage"]["status"] == "pass" and checks["q/k/v and gate/up order"]["status"] == "pass"
    assert checks["port loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["status"] == "FAIL" and checks["parity: log-probabilities"]["on"] == "twin"
    assert checks["parity: log-probabilities"]["max_delta"] > 1e-2
    assert checks["divergence"]["module"] == "layer 0 self_attn"
    print(f"mutant (rope_theta 1e6 -> 1e4) on the twin: max |dlogp| {checks['parity: log-probabilities']['max_delta']:.2e}")


@pytest.mark.engine
@pytest.mark.slow
def test_twin_verifies_a_mixture_of_experts_shaped_like_qwen3_235b(workdir):
    """94 layers of 128 experts: the mapping of all ~37k tensors statically, parity on a 4-expert twin."""
    ckpt = write_sparse(workdir / "ckpt-big-qwen3-moe", QWEN3_235B_A22B, shards=118, architecture="ScaffoldBigMoeForCausalLM")
    port = workdir / "port-big-qwen3-moe"
    scaffold("new", ckpt, "-o", port, "--force")
    rc, report, rchar = verify_twin(port)
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 0 and report["passed"], json.dumps(report, indent=2)
    tensors = len(decoder_tensors(QWEN3_235B_A22B))
    assert checks["mapping coverage"]["on"] == "checkpoint"
    assert checks["mapping coverage"]["detail"].startswith(f"{tensors} tensors"), checks["mapping coverage"]
    assert "128 experts with gate/up 1536 rows each" in checks["per-shard shapes"]["detail"]
    assert checks["expert projections"]["status"] == "pass"
    assert "3 of 94 layers" in checks["twin"]["detail"], checks["twin"]
    for name in ("port loaded by vLLM", "parity: log-probabilities", "parity: greedy continuation"):
        assert checks[name]["status"] == "pass" and checks[name]["on"] == "twin", checks[name]
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    print(f"MoE twin parity: max |dlogp| {checks['parity: log-probabilities']['max_delta']:.2e} "
          f"({tensors} real tensors mapped; verify read {rchar / 2**20:.0f} MiB)")
