"""What every test package shares: the offline environment and the tiny engine configuration. The
engines themselves live in package-scoped fixtures (tests/engine, tests/gateway), shut down when their
package is done, so that no more engines run at once than one package needs."""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engine_adapter.config import EngineConfig

# Small on purpose: 23 usable blocks of 32 tokens (block 0 is vLLM's null block), so a handful of
# sessions already overflow the cache. max_model_len must still fit in it.
TINY_KV_BLOCKS = 24
TINY_BLOCK_SIZE = 32
TINY_MAX_LEN = 512
TINY_MAX_SEQS = 4


def tiny_config(policy: str, **overrides: object) -> EngineConfig:
    kw: dict[str, object] = dict(
        model="tiny",
        policy=policy,
        dtype="float32",  # exact equivalence: bf16 diverges when prefill chunking differs
        num_kv_blocks=TINY_KV_BLOCKS,
        block_size=TINY_BLOCK_SIZE,
        max_model_len=TINY_MAX_LEN,
        max_num_seqs=TINY_MAX_SEQS,
        # Short TTLs so the ttl policy both keeps (short calls) and expires (long calls) in tests.
        ttl_s={"math": 5.0, "chat": 0.3, "default": 0.3},
    )
    kw.update(overrides)
    return EngineConfig(**kw)  # type: ignore[arg-type]


# A fresh-clone run of the whole suite once segfaulted *after* pytest's summary, in the process's exit, so
# the command exited 139 whatever the tests said. The cause: Fast Downward (ALFWorld's planner) registers
# an on_exit handler and signal handlers, and the ALFWorld tool unloaded its library after each game; glibc
# then called into unmapped code at exit. Fixed where it lives (augmentations/alfworld_pool.py lends the
# libraries out instead; tests/augmentations/test_alfworld.py checks a process exits cleanly). The suite's
# process finalizes normally; should anything fault there again, faulthandler is back on for the exit
# (pytest's plugin switches it off at unconfigure) and names the thread.
import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import faulthandler

    faulthandler.enable(file=sys.__stderr__, all_threads=True)



