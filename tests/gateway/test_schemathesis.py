"""Generated requests against the package's gateway, from its own /openapi.json (schemathesis): no 5xx,
and every status a route answers is one its document declares. A bounded run (`infercept loadtest`
runs >= 1,000 requests); the sessions it opens are closed afterwards so the tests after it start clean."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.gateway.conftest import API_KEY, Served

EXAMPLES_PER_OPERATION = 8


@pytest.mark.slow
async def test_generated_requests_get_no_5xx_and_only_documented_statuses(served: Served, tmp_path: Path) -> None:
    exe = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    if not Path(exe).exists():
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    before = set(served.gw.sessions)
    har = tmp_path / "run.har"
    proc = await asyncio.create_subprocess_exec(
        exe, "run", f"{served.url}/openapi.json", "--checks", "not_a_server_error,status_code_conformance,response_schema_conformance",
        "--max-examples", str(EXAMPLES_PER_OPERATION), "--seed", "7", "--header", f"Authorization: Bearer {API_KEY}",
        "--request-timeout", "120", "--suppress-health-check", "all", "--report", "har", "--report-har-path", str(har),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path)
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    try:
        entries = json.loads(har.read_text())["log"]["entries"]
        statuses = Counter(e["response"]["status"] for e in entries)
        assert proc.returncode == 0, text[-4000:]
        assert not [s for s in statuses if s >= 500], statuses
        assert len(entries) >= 100 and 200 in statuses and 400 in statuses, (len(entries), statuses)
    finally:
        for sid in set(served.gw.sessions) - before:
            await served.gw.close_session(sid)
