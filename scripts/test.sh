#!/usr/bin/env bash
# Install everything into .venv/ (idempotent), build the offline models, run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/policy -x).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install.sh
# The web-client test drives Debian's Chromium (no browser download). Install it where we can (root
# with apt); elsewhere that one test is skipped with the reason.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium for the browser test..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; } \
        || echo "warning: could not install chromium; the browser test will be skipped" >&2
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/infercept model prepare --name tiny
.venv/bin/infercept model prepare --name default
set +e
# The slowest tests are listed at the end, so a CI log shows where the time goes.
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    # pytest's "no tests collected": this suite always has tests, so that means a broken collection.
    echo "error: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
