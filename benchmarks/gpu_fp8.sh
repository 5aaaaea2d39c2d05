#!/usr/bin/env bash
# FP8 on one H200, vLLM 0.24.0 (studies/gpu-h200-fp8.md): a port generated here from a sparse FP8
# Qwen3-4B-shaped checkpoint (benchmarks/fp8_checkpoints.py; quant_method "fp8", per-tensor weight
# scales, dynamic activations) against vLLM's own Qwen3ForCausalLM on the same random FP8 checkpoint,
# made there with torch: log-probabilities (studies/moe_parity.py) and throughput, side by side in
# interleaved rounds (scaffold bench --only port --only native).
#
# The device tool sends the checkout its session started in, not a helper's worktree, so `prepare`
# puts everything the GPU needs into one ignored folder Q (.gpu/q) of each checkout named:
# b.00-03 (the vLLM 0.24.0 bundle of shared/gpu/make-bundle.sh, 50 MB parts), whl/ (compressed-tensors
# 0.17.0 and loguru, which the bundle lacks and vLLM 0.24 imports for any quantized checkpoint) and
# code.tgz (this worktree's scaffold/, templates/, benchmarks/, studies/moe_parity.py and the port,
# port-fp8/).
#
# Here:   benchmarks/gpu_fp8.sh prepare [OTHER_CHECKOUT ...]
# There (device tool, each call within 30 s of the last; call N carries .gpu/q/b.0N and .gpu/q/code.tgz):
#   1: mkdir -p ~/q && tar xzf .gpu/q/code.tgz -C ~/q && ~/q/benchmarks/gpu_fp8.sh stash .gpu/q/b.00 &&
#      ~/q/benchmarks/gpu_fp8.sh checkpoint
#   2, 3: ~/q/benchmarks/gpu_fp8.sh stash .gpu/q/b.0N
#   4 (carries .gpu/q/whl too): ~/q/benchmarks/gpu_fp8.sh stash .gpu/q/b.03 && ~/q/benchmarks/gpu_fp8.sh unpack &&
#      ~/q/benchmarks/gpu_fp8.sh parity -o $OUT --dtype bfloat16
#   5: ~/q/benchmarks/gpu_fp8.sh bench -o $OUT/bench --model-runner v2 --repeats 3 --prompts 200
set -euo pipefail
ARCH=BenchQwen3Fp8ForCausalLM
step=${1:?usage: gpu_fp8.sh prepare|stash FILE|checkpoint|unpack|parity|bench [options]}
shift
gpu_env() {
  cd ~/q
  # The same (V2) model runner for both: vLLM 0.24 picks V2 only for an allowlist a port is not on.
  export PYTHONPATH=~/v024:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
    VLLM_USE_V2_MODEL_RUNNER=1
}
case "$step" in
  prepare)
    cd "$(dirname "$0")/.."
    shared=${SHARED:-$(cd .. && pwd)/shared}
    [ -f .gpu/b.03 ] || bash "$shared/gpu/make-bundle.sh"
    rm -rf .gpu/q && mkdir -p .gpu/q/stage
    python benchmarks/fp8_checkpoints.py sparse qwen3-4b .gpu/q/sparse --architecture $ARCH
    python -m scaffold.cli new .gpu/q/sparse -o .gpu/q/stage/port-fp8 --force
    git ls-files scaffold templates benchmarks studies/moe_parity.py pyproject.toml | tar cf - -T - | tar xf - -C .gpu/q/stage
    cp benchmarks/fp8_checkpoints.py benchmarks/gpu_fp8.sh .gpu/q/stage/benchmarks/  # uncommitted copies too
    tar czf .gpu/q/code.tgz -C .gpu/q/stage .
    ln -f .gpu/b.0[0-3] .gpu/q/
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform any -d .gpu/q/whl compressed-tensors==0.17.0 loguru==0.7.3
    rm -rf .gpu/q/stage .gpu/q/sparse
    for other in "$@"; do
      mkdir -p "$other/.gpu/q" && cp -r -l -f .gpu/q/. "$other/.gpu/q/"
    done
    ls -la .gpu/q
    ;;
  stash)
    mkdir -p ~/stash && cp "$1" ~/stash/
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  checkpoint)
    time python3 ~/q/benchmarks/fp8_checkpoints.py random qwen3-4b ~/ckpt-fp8 --architecture $ARCH
    du -sh ~/ckpt-fp8
    ;;
  unpack)
    mkdir -p ~/v024
    cat ~/stash/b.* | tar xzf - -C ~/v024
    for wheel in .gpu/q/whl/*.whl; do python3 -m zipfile -e "$wheel" ~/v024; done
    ;;
  parity)
    gpu_env
    python3 studies/moe_parity.py port-fp8 --checkpoint ~/ckpt-fp8 "$@"
    ;;
  bench)
    gpu_env
    python3 -m scaffold.cli bench port-fp8 --checkpoint ~/ckpt-fp8 --prefill 1024:128 --decode 128:512 \
      --latency 128:256 --max-model-len 2048 --multiprocessing --only port --only native "$@"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
