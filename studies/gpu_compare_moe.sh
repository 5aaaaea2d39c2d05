#!/usr/bin/env bash
# The mixture-of-experts comparison of studies/README.md: the generated port against vLLM's own
# Qwen3-MoE (parity and throughput) and the transformers backend (throughput) on one H200, vLLM
# 0.24.0, a Qwen3-30B-A3B-shaped random bf16 checkpoint cut to 6 layers (8.7 GB).
#
# Here (CPU machine):    studies/gpu_compare_moe.sh prepare
#   needs .gpu/s.00-02 (benchmarks/gpu_compare.sh prepare: the trimmed vLLM 0.24.0 bundle, xz);
#   adds vLLM's MoE kernels (vllm/_moe_C_stable_libtorch.abi3.so, which make-bundle.sh drops), taken
#   from the vllm 0.24.0 wheel, as a second xz stream after the bundle, and splits the whole into
#   three parts .gpu/m.00-02 of 54.5 MB (each fits one device call beside the 8 MB working tree);
#   generates the port from a sparse checkpoint of the same shape into .gpu/port-moe.
# There (device tool, calls within 30 s of each other; carry .gpu/m.0N and .gpu/port-moe):
#   1: studies/gpu_compare_moe.sh stash 00 && studies/gpu_compare_moe.sh checkpoint
#   2: studies/gpu_compare_moe.sh stash 01
#   3: studies/gpu_compare_moe.sh stash 02 && studies/gpu_compare_moe.sh unpack &&
#      studies/gpu_compare_moe.sh parity -o $OUT --dtype bfloat16 --timeout 240 &&
#      studies/gpu_compare_moe.sh parity -o $OUT --dtype float32 --timeout 120     (~210 s)
#   4: studies/gpu_compare_moe.sh bench -o $OUT/bench --model-runner v2 --repeats 3 --prompts 200
#      (~410 s, ~300 s of it the three engine starts; with --prompts 1000 it outruns one call)
# Results and device time: studies/README.md, "H200: mixture of experts (vLLM 0.24.0)".
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=BenchQwen3MoeForCausalLM
SHAPE=(qwen3-30b-a3b --layers 6)
step=${1:?usage: gpu_compare_moe.sh prepare|stash NN|unpack|checkpoint|parity|bench [options]}
shift
gpu_env() {
  export PYTHONPATH=~/v024:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
}
case "$step" in
  prepare)
    [ -f .gpu/s.02 ] || bash benchmarks/gpu_compare.sh prepare
    if [ ! -f .gpu/m.02 ]; then
      tmp=$(mktemp -d)
      python -m pip download -q --no-deps -d "$tmp" vllm==0.24.0
      unzip -q "$tmp"/vllm-0.24.0-*.whl vllm/_moe_C_stable_libtorch.abi3.so -d "$tmp/moe"
      tar cf - -C "$tmp/moe" vllm | xz -T1 -6 > "$tmp/moe.tar.xz"
      # xz decodes concatenated streams as one; `tar -i` reads past the first archive's end.
      cat .gpu/s.00 .gpu/s.01 .gpu/s.02 "$tmp/moe.tar.xz" > "$tmp/all.xz"
      split -n 3 -d -a 2 "$tmp/all.xz" .gpu/m.
      md5sum "$tmp/all.xz" && rm -rf "$tmp"
    fi
    ckpt=$(mktemp -d)/moe-sparse
    python benchmarks/checkpoints.py sparse "${SHAPE[@]}" "$ckpt" --architecture $ARCH
    scaffold new "$ckpt" -o .gpu/port-moe --force
    rm -rf "$(dirname "$ckpt")"
    ;;
  stash)
    mkdir -p ~/stash && cp ".gpu/m.$1" ~/stash/
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  unpack)
    mkdir -p ~/v024
    cat ~/stash/m.* | xz -d | tar xif - -C ~/v024
    ls -la ~/v024/vllm/_moe_C_stable_libtorch.abi3.so
    ;;
  checkpoint)
    python3 benchmarks/checkpoints.py random "${SHAPE[@]}" ~/ckpt-moe --architecture $ARCH
    du -sh ~/ckpt-moe
    ;;
  parity)
    gpu_env
    python3 studies/moe_parity.py .gpu/port-moe --checkpoint ~/ckpt-moe "$@"
    ;;
  bench)
    gpu_env
    python3 -m scaffold.cli bench .gpu/port-moe --checkpoint ~/ckpt-moe --prefill 1024:128 --decode 128:512 \
      --latency 128:256 --max-model-len 2048 --multiprocessing "$@"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
