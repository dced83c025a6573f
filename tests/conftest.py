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


# ---------------------------------------------------------------------------------------------- test tiers
# A test's tier follows from the fixtures it uses: a fixture that starts something expensive asks for one of
# these marker fixtures (`async def policy_engine(request, uses_engine)`), and every test that uses it, however
# indirectly, gets the marker; a test that starts an engine or a server itself asks for the fixture too.
# `slow` is set by hand on the few tests that take minutes. `scripts/test.sh --fast` deselects them all.
TIER_FIXTURES = {
    "uses_engine": "engine",
    "uses_server": "server",
    "uses_default_model": "default_model",
    "uses_gpu": "gpu",
}
TIERS = {
    "engine": "starts a real vLLM engine (the tiny model unless also default_model)",
    "server": "starts the HTTP gateway: in process on a loopback port, or as a process",
    "default_model": "needs the default model (SmolLM2-135M-Instruct, `infercept model prepare`)",
    "gpu": "needs a CUDA GPU (skipped without one)",
    "slow": "takes minutes on 2 cores",
    "policies": "policies(*names): the policies a policy_engine test depends on (default: every policy)",
}


@pytest.fixture(scope="session")
def uses_engine() -> None:
    """Marks its users `engine`."""


@pytest.fixture(scope="session")
def uses_server(uses_engine: None) -> None:
    """Marks its users `server` (and `engine`: a gateway embeds one)."""


@pytest.fixture(scope="session")
def uses_default_model(uses_engine: None) -> None:
    """Marks its users `default_model` (and `engine`)."""


@pytest.fixture(scope="session")
def uses_gpu() -> None:
    """Marks its users `gpu`; skips them where no CUDA GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in TIER_FIXTURES.items():
            if fixture in used:
                item.add_marker(marker)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # One engine per policy, shared by the package's tests (package scope): each test runs under the
    # policies it depends on (`@pytest.mark.policies(...)`), every policy where it names none.
    if "policy_engine" in metafunc.fixturenames:
        from engine_adapter.policy import POLICY_NAMES
        from engine_adapter.policy.table import policy_spec

        marker = metafunc.definition.get_closest_marker("policies")
        names = tuple(marker.args) if marker else POLICY_NAMES
        for n in names:
            policy_spec(n)  # an unknown name fails the collection, naming it
        metafunc.parametrize("policy_engine", names, indirect=True, scope="package", ids=list(names))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import faulthandler

    faulthandler.enable(file=sys.__stderr__, all_threads=True)



