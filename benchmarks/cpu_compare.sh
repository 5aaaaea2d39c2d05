#!/usr/bin/env bash
# CPU comparison of docs/performance.md: port vs native vs transformers backend, ~100M-parameter
# random checkpoints (llama, qwen3, gemma2, qwen3_moe), bf16, `scaffold bench` with its defaults
# (compiled mode, three interleaved rounds). Results land in ${WORK:-/tmp/cpu-compare}/<model>/.
# Usage: [BENCH_ARGS="..."] benchmarks/cpu_compare.sh [model ...]   (default: llama qwen3 gemma2 qwen3_moe)
set -uo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/tmp/cpu-compare}
mkdir -p "$work"
py=${PYTHON:-.venv/bin/python}
models=${*:-llama qwen3 gemma2 qwen3_moe}
for model in $models; do
  ckpt=$work/ckpt-$model
  arch=$($py - "$model" <<'PY'
import sys
print("Cpu" + {"llama": "Llama", "qwen3": "Qwen3", "gemma2": "Gemma2", "qwen3_moe": "Qwen3Moe"}[sys.argv[1]] + "ForCausalLM")
PY
)
  if [ ! -f "$ckpt/config.json" ]; then
    $py - "$model" "$ckpt" "$arch" <<'PY'
import sys
from scaffold.tiny import build_tiny
model, out, arch = sys.argv[1:]
# ~100M parameters: 6 layers of width 768, 12 heads of 64 (4 KV heads), vocab 32000.
sizes = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=6, num_attention_heads=12,
             num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=4096)
if model == "gemma2":  # Gemma 2 ties its head to the embedding (vLLM's Gemma2 class requires it)
    sizes.update(tie_word_embeddings=True)
if model == "qwen3_moe":  # 16 experts of 768, 4 routed: 229M parameters, ~100M of them active per token
    sizes.update(moe_intermediate_size=768, num_experts=16, num_experts_per_tok=4, decoder_sparse_step=1)
build_tiny(model, out, architecture=arch, overrides=sizes, std=0.02, max_shard_size="200MB")
PY
  fi
  echo "== $model: $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  $py -m scaffold.cli new "$ckpt" -o "$work/port-$model" --force || { echo "$model: no port generated"; continue; }
  $py -m scaffold.cli bench "$work/port-$model" -o "$work/$model" ${BENCH_ARGS:-} 2>&1 | grep --line-buffered -v "^INFO\|^WARNING\|^\s*$"
done
