"""The benchmark's resumable store: points survive the process, a different plan is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercept.benchmarks.points import PlanMismatch, PointStore


def test_points_survive_and_a_rerun_resumes(tmp_path: Path) -> None:
    plan = {"rates": [3.0, 6.0], "code": "abc"}
    store = PointStore(tmp_path, plan)
    assert store.resumed == 0
    key = PointStore.key("round0", "infercept@x0.3", "512", 1, "4.5")
    assert store.get(key) is None
    store.put(key, {"rate": 4.5, "completed": 10})
    again = PointStore(tmp_path, dict(plan))
    assert again.resumed == 1 and again.get(key) == {"rate": 4.5, "completed": 10}
    assert not list((tmp_path / "points").glob("*.tmp"))  # written aside, then renamed


def test_another_plan_or_commit_is_refused(tmp_path: Path) -> None:
    PointStore(tmp_path, {"rates": [3.0, 6.0], "code": "abc"})
    with pytest.raises(PlanMismatch, match="differs in code, rates"):
        PointStore(tmp_path, {"rates": [3.0], "code": "def"})


def test_the_code_digest_follows_code_not_docs() -> None:
    from infercept.benchmarks.runner import CODE_PATHS, code_digest

    digest = code_digest()
    assert digest is not None and len(digest.split()) == len(CODE_PATHS)  # one tree or blob hash per path
