"""The example scripts run against a real gateway on the default model (a short run of each that
only needs the calculator)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


async def run(script: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLES / script), *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode()
    assert proc.returncode == 0, text[-3000:]
    return text


async def test_react_math_example(default_url: str) -> None:
    out = await run("react_math.py", "--url", default_url, "--limit", "1")
    assert "[tool_call] Calculator[29*13] (server)" in out
    assert "[tool_result] '377'" in out and "-> RIGHT (read 377.0)" in out
    assert "accuracy with calculator: 1/1" in out and "accuracy without tools:" in out


async def test_openai_client_example(default_url: str) -> None:
    out = await run("openai_client.py", "--url", default_url)
    assert "Observation: 377" in out and "answer: '377'" in out
    assert "finish_reason=tool_calls" in out and "ran get_weather" in out
