"""Every experiment under `infercept.benchmarks.experiments` imports, parses its command line, and the ones
that run on the simulator or on committed data run here (the real-engine ones are run alone on a machine)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from infercept.benchmarks import experiments
from infercept.benchmarks.experiments import bound_check, decode_context, pause_holds

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", experiments.EXPERIMENTS)
def test_every_experiment_imports_and_has_a_command(name: str) -> None:
    mod = importlib.import_module(f"infercept.benchmarks.experiments.{name}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0


def test_pause_holds_watches_the_core_through_its_observers() -> None:
    (r,) = pause_holds.run(REPO / "results/bench/bench.json", REPO / "results/sim/validation.json", [1], 8.0)
    assert r["seed"] == 1 and r["steps"] > 0 and r["seconds"] > 0
    # Every paused context the workload had ends in one of the core's fates, and its device time is a share.
    assert set(r["types"]) == {"chat", "image", "math", "qa", "tts", "ve"}
    for t in r["types"].values():
        assert t["n"] == sum(t["fates"].values()) > 0
        assert 0.0 <= t["device_share_of_capacity_time"] < 1.0
    # A swap-out's start is seen by the observer: some contexts waited for their copy to start.
    split = r["preserved_idle_split"]
    assert split["before the copy out starts"] > 0
    total = sum(t["device_share_of_capacity_time"] for t in r["types"].values())
    assert sum(split.values()) == pytest.approx(total)


def test_decode_context_grid_parsing() -> None:
    assert decode_context.parse_grid("8x512,32x1024") == [(8, 512), (32, 1024)]
    assert decode_context.parse_grid("") == decode_context.GRID
    with pytest.raises(ValueError, match="BATCHxCONTEXT"):
        decode_context.parse_grid("8by512")


def test_bound_check_summarizes_committed_turns() -> None:
    line = bound_check.summary_line(REPO / "results/bench/bound_check/turns_bound.json")
    assert line.startswith("turns_bound ") and "new-ttft med" in line and "per-token decode med" in line
