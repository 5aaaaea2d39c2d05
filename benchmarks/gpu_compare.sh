#!/usr/bin/env bash
# The GPU comparison of docs/performance.md: the generated port, vLLM's own Qwen3 and the
# transformers backend on one H200, Qwen3-4B-shaped random bf16 checkpoint, vLLM 0.24.0.
#
# Here (CPU machine):    benchmarks/gpu_compare.sh prepare
#   builds the vLLM 0.24.0 bundle (shared/gpu/make-bundle.sh), repacks it smaller (xz, without
#   xgrammar's static library) into three parts .gpu/s.00-02 that each fit one device call with
#   the working tree, and generates the port from a sparse Qwen3-4B-shaped checkpoint into
#   .gpu/port (the GPU machine has no ruff, which `scaffold new` needs).
# There (device tool, calls within 30 s of each other; carry .gpu/s.0N and .gpu/port):
#   1: benchmarks/gpu_compare.sh stash 00 && benchmarks/gpu_compare.sh checkpoint
#   2: benchmarks/gpu_compare.sh stash 01
#   3: benchmarks/gpu_compare.sh stash 02 && benchmarks/gpu_compare.sh unpack &&
#      benchmarks/gpu_compare.sh bench -o $OUT/warm --repeats 1 --prompts 64   (fills the compile caches)
#   4: benchmarks/gpu_compare.sh bench -o $OUT/full --repeats 3 --prompts 500
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=BenchQwen3ForCausalLM
step=${1:?usage: gpu_compare.sh prepare|stash NN|unpack|checkpoint|bench [scaffold bench options]}
shift
case "$step" in
  prepare)
    shared=${SHARED:-$(cd .. && pwd)/shared}
    [ -f .gpu/b.00 ] || bash "$shared/gpu/make-bundle.sh"
    if [ ! -f .gpu/s.02 ]; then
      tmp=$(mktemp -d)
      cat .gpu/b.* | tar xzf - -C "$tmp"
      rm -f "$tmp/xgrammar/lib/libxgrammar.a"
      tar cf - -C "$tmp" . | xz -T0 -6 > .gpu/bundle.txz
      split -b 41400000 -d -a 2 .gpu/bundle.txz .gpu/s.
      md5sum .gpu/bundle.txz && rm -rf .gpu/bundle.txz "$tmp"
    fi
    ckpt=$(mktemp -d)/qwen3-4b-sparse
    python benchmarks/checkpoints.py sparse qwen3-4b "$ckpt" --architecture $ARCH
    scaffold new "$ckpt" -o .gpu/port --force
    ;;
  stash)
    mkdir -p ~/stash && cp ".gpu/s.$1" ~/stash/
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  unpack)
    mkdir -p ~/v024
    cat ~/stash/s.* | xz -d | tar xf - -C ~/v024
    ;;
  checkpoint)
    python3 benchmarks/checkpoints.py random qwen3-4b ~/ckpt --architecture $ARCH
    ;;
  bench)
    export PYTHONPATH=~/v024:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
    python3 -m scaffold.cli bench .gpu/port --checkpoint ~/ckpt --prefill 1024:128 --decode 128:512 \
      --latency 128:256 --max-model-len 2048 --multiprocessing "$@"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
