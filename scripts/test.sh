#!/usr/bin/env bash
# Install everything into .venv/ (idempotent), build the offline models, run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/policy -x).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install.sh
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/infercept model prepare --name tiny
.venv/bin/infercept model prepare --name default
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected": this suite always has tests, so that means a broken collection.
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
