"""The offline augmentations, run for real: the Stable Diffusion pipeline, Piper speech, and the human
channel (ALFWorld: test_alfworld.py; Bark: test_bark.py). Each one's error path becomes an observation
(ToolError), never a crash."""

from __future__ import annotations

import asyncio
import io
import struct
import wave
from pathlib import Path

import pytest

from augmentations.base import CallContext, ToolError
from augmentations.human import AskHuman
from augmentations.image import ImageGen
from augmentations.tts import Speech, wav_seconds
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The tiny SD pipeline goes to a per-run home (it is built, not downloaded).
    return tmp_path_factory.mktemp("infercept-home")


async def test_image_generates_a_png_from_the_local_pipeline(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERCEPT_HOME", str(home))
    tool = ImageGen(steps=2, size=64)
    res = await tool.run("a red fox in the snow", CallContext())
    (art,) = res.artifacts
    assert art.mime == "image/png" and art.data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", art.data[16:24])
    assert (width, height) == (64, 64)
    assert res.content == "An image of a red fox in the snow (64x64 PNG)."
    assert (home / "models" / "tiny-sd" / "model_index.json").is_file()
    # Seeded: the same prompt gives the same picture.
    again = await tool.run("a red fox in the snow", CallContext())
    assert again.artifacts[0].data == art.data
    with pytest.raises(ToolError):
        await tool.run("   ", CallContext())
    with pytest.raises(ToolError, match="at most"):
        await tool.run("x" * 1000, CallContext())
    await tool.close()


async def test_speech_returns_a_real_wav() -> None:
    tool = Speech()
    assert tool.backend in ("piper", "espeak-ng")
    res = await tool.run("Hello from the offline speech engine.", CallContext())
    (art,) = res.artifacts
    assert art.mime == "audio/wav"
    with wave.open(io.BytesIO(art.data)) as w:
        assert w.getnframes() > 0 and w.getframerate() >= 8000
        frames = w.readframes(w.getnframes())
    assert any(b != 0 for b in frames[:20000])  # not silence
    secs = wav_seconds(art.data)
    assert 0.5 < secs < 10
    assert res.content == f"Spoke 6 words ({secs:.1f} s of audio)."
    with pytest.raises(ToolError):
        await tool.run("", CallContext())
    with pytest.raises(ValueError, match="backend"):
        Speech(backend="nope")
    await tool.close()


async def test_ask_human_waits_for_the_answer() -> None:
    tool = AskHuman()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asked: list[str] = []

    async def ask(q: str) -> str:
        asked.append(q)
        return await answer

    task = asyncio.create_task(tool.run("What time?", CallContext(extra={"ask_human": ask})))
    await wait_until(lambda: asked == ["What time?"], 10, "the question to reach the human")
    assert not task.done()
    answer.set_result("7 pm")
    assert (await task).content == "7 pm"
    with pytest.raises(ToolError, match="no human"):
        await tool.run("anyone?", CallContext())
