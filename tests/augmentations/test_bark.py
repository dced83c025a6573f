"""Bark through Suno's `bark` package, end to end: its checkpoint loader, its three GPT stages and EnCodec's
decoder run on a tiny random-weight checkpoint folder built locally (the audio is noise; the path is real)."""

from __future__ import annotations

import io
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from augmentations.bark_tts import SAMPLE_RATE, build_tiny_bark, checkpoint_globals
from augmentations.base import CallContext, ToolError
from augmentations.tts import Speech, wav_seconds


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("infercept-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERCEPT_HOME", str(home))
        yield home


def test_tiny_checkpoint_folder_is_barks_format(home: Path) -> None:
    import torch
    from transformers import BertTokenizer

    folder = build_tiny_bark(home / "models" / "tiny-bark")
    assert sorted(p.name for p in folder.iterdir()) == [
        "coarse_2.pt", "encodec_24khz.th", "fine_2.pt", "text_2.pt", "tokenizer"]
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(folder / "text_2.pt")  # as Bark's own checkpoints on torch >= 2.6
    with torch.serialization.safe_globals(checkpoint_globals()):
        ckpt, fine = torch.load(folder / "text_2.pt"), torch.load(folder / "fine_2.pt")
    assert set(ckpt) == {"model_args", "model", "best_val_loss"}
    assert ckpt["model_args"]["input_vocab_size"] == 129_600 and ckpt["model_args"]["output_vocab_size"] == 10_048
    assert fine["model_args"]["n_codes_total"] == 8
    tok = BertTokenizer.from_pretrained(str(folder / "tokenizer"))
    ids = tok.encode("Hi there", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["H", "##i", "t", "##h", "##e", "##r", "##e"]
    assert build_tiny_bark(folder) == folder  # built once


async def test_bark_speaks_through_its_own_generation_code(home: Path) -> None:
    tool = Speech(backend="bark", model="tiny", max_seconds=1.0)
    res = await tool.run("Hello from Bark.", CallContext())
    (art,) = res.artifacts
    assert art.mime == "audio/wav"
    with wave.open(io.BytesIO(art.data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        # 1 s of semantic tokens (49.9 Hz) -> 75 coarse frames -> 75 EnCodec frames of 320 samples.
        assert w.getnframes() == 75 * 320
        frames = w.readframes(w.getnframes())
    assert any(frames)  # noise, not silence
    assert res.content == "Spoke 3 words (1.0 s of audio)."
    again = await tool.run("Hello from Bark.", CallContext())
    assert again.artifacts[0].data == art.data  # seeded
    await tool.close()


async def test_bark_speaker_prompt_and_errors(home: Path, tmp_path: Path) -> None:
    # A speaker prompt shipped in Bark's wheel conditions all three stages.
    voiced = Speech(backend="bark", model="tiny", voice="v2/en_speaker_6", max_seconds=0.5)
    res = await voiced.run("Good morning.", CallContext())
    assert wav_seconds(res.artifacts[0].data) == pytest.approx(0.5, abs=0.03)
    await voiced.close()
    missing = Speech(backend="bark", model=str(tmp_path / "no-such-folder"))
    with pytest.raises(ToolError, match="not found"):
        await missing.run("Hello.", CallContext())
    (tmp_path / "half").mkdir()
    half = Speech(backend="bark", model=str(tmp_path / "half"))
    with pytest.raises(ToolError, match="no text_2.pt or text.pt"):
        await half.run("Hello.", CallContext())
    # Piper stays the default voice; naming a Bark model picks Bark.
    assert Speech().backend == "piper" and Speech(model="tiny").backend == "bark"


async def test_checkpoints_pickled_by_numpy_1_load(home: Path, tmp_path: Path) -> None:
    """Bark's published checkpoints carry best_val_loss as numpy.core.multiarray.scalar (NumPy 1's path),
    which torch >= 2.6 refuses by default (suno-ai/bark#626). Rewrite the tiny checkpoints that way and load
    them through the tool."""
    import zipfile

    src = build_tiny_bark(home / "models" / "tiny-bark")
    folder = tmp_path / "numpy1"
    shutil.copytree(src, folder)
    for stage in ("text", "coarse", "fine"):
        path = folder / f"{stage}_2.pt"
        with zipfile.ZipFile(path) as zin:
            entries = [(info, zin.read(info.filename)) for info in zin.infolist()]
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
            for info, data in entries:
                if info.filename.endswith("data.pkl"):
                    assert b"numpy._core.multiarray\nscalar" in data
                    data = data.replace(b"numpy._core.multiarray\nscalar", b"numpy.core.multiarray\nscalar")
                zout.writestr(info, data)
    tool = Speech(backend="bark", model=str(folder), max_seconds=0.5)
    res = await tool.run("Hello.", CallContext())
    assert wav_seconds(res.artifacts[0].data) == pytest.approx(0.5, abs=0.03)
    await tool.close()
