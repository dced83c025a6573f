"""Bark, Suno's text-to-audio model, through its own package (`bark`): three GPT stages (text -> semantic
tokens -> coarse EnCodec codes -> fine codes) and the EnCodec 24 kHz decoder.

Where the weights come from (`model` setting of the TTS tool):
* unset / `suno/bark`: Bark's own `preload_models()`, which reads its cache folder (`$XDG_CACHE_HOME/suno/
  bark_v0`) and downloads from the hub what is missing; `suno/bark-small` the same with the small models.
* a folder laid out like that cache: `text_2.pt coarse_2.pt fine_2.pt` (or the small `text.pt ...`), read
  by Bark's own checkpoint loader; optionally `tokenizer/` (a BERT tokenizer folder; otherwise Bark's
  `bert-base-multilingual-cased` from the hub or the HF cache) and EnCodec's weights, either the official
  `encodec_24khz-d7cc33bc.th` (EnCodec's own offline path, checksum-checked) or any `encodec_24khz.th`
  state dict (otherwise EnCodec downloads its pretrained weights).
* `tiny`: such a folder built here once, under `$INFERCEPT_HOME/models/tiny-bark`: Bark's real
  architectures (GPT, FineGPT, EnCodec 24 kHz) with tiny dimensions and seeded random weights, and a
  character-level BERT WordPiece vocabulary. Every line of Bark's generation code runs; the audio is noise.

Bark keeps its models in one module-level dict (`bark.generation.models`), so a process holds one Bark
model set at a time; `BarkVoice` swaps its own in under a lock before each generation.
"""

from __future__ import annotations

import os
import string
import threading
from pathlib import Path
from typing import Any

from augmentations.base import ToolError
from engine_adapter.paths import infercept_home

SAMPLE_RATE = 24_000
STAGES = ("text", "coarse", "fine")
HUB_MODELS = {"suno/bark": False, "suno/bark-small": True}  # id -> use the small models
_LOCK = threading.Lock()
_loaded: list[str | None] = [None]  # which model set bark.generation.models holds


def tiny_bark_dir() -> Path:
    return infercept_home() / "models" / "tiny-bark"


def build_tiny_bark(out: Path, seed: int = 0) -> Path:
    """Write a tiny random-weight Bark checkpoint folder to `out` (idempotent)."""
    if (out / "fine_2.pt").is_file():
        return out
    import numpy as np
    import torch
    from bark.generation import (
        CODEBOOK_SIZE,
        N_FINE_CODEBOOKS,
        SEMANTIC_VOCAB_SIZE,
        TEXT_ENCODING_OFFSET,
    )
    from bark.model import GPT, GPTConfig
    from bark.model_fine import FineGPT, FineGPTConfig
    from encodec import EncodecModel
    from transformers import BertTokenizer

    torch.manual_seed(seed)
    tmp = out.with_name(out.name + ".tmp")
    (tmp / "tokenizer").mkdir(parents=True, exist_ok=True)
    # Vocabulary sizes are Bark's own (they are baked into its generation code: text ids are offset by
    # 10,048 and padded with 129,595; coarse codes follow the 10,000 semantic ids); only widths shrink.
    dims = {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 1024, "dropout": 0.0, "bias": False}
    coarse_vocab = SEMANTIC_VOCAB_SIZE + 2 * CODEBOOK_SIZE + 48  # 12,096 as in Bark's coarse checkpoints
    stages = {
        "text": (GPT, GPTConfig, {"input_vocab_size": 129_600, "output_vocab_size": TEXT_ENCODING_OFFSET}),
        "coarse": (GPT, GPTConfig, {"input_vocab_size": coarse_vocab, "output_vocab_size": coarse_vocab}),
        "fine": (FineGPT, FineGPTConfig, {"input_vocab_size": CODEBOOK_SIZE + 32, "n_codes_given": 1,
                                          "output_vocab_size": CODEBOOK_SIZE + 32, "n_codes_total": N_FINE_CODEBOOKS}),
    }
    for stage, (model_cls, config_cls, sizes) in stages.items():
        args = {**dims, **sizes}
        model = model_cls(config_cls(**args))
        # Bark's checkpoint format (what bark.generation._load_model reads); best_val_loss is a NumPy
        # scalar as in Bark's published checkpoints, so loading needs the allowlist below, as theirs do.
        torch.save({"model_args": args, "model": model.state_dict(), "best_val_loss": np.float64(0.0)},
                   tmp / f"{stage}_2.pt")
    codec = EncodecModel.encodec_model_24khz(pretrained=False)
    # Random weights: half precision halves the file (93 -> 47 MB); load_state_dict casts back.
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in codec.state_dict().items()},
               tmp / "encodec_24khz.th")
    # A WordPiece vocabulary of single characters (and their ## continuations): BERT's tokenizer code,
    # character granularity; every id stays below mBERT's 119,547, as Bark's text encoding requires.
    chars = [c for c in string.printable if not c.isspace()]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    (tmp / "tokenizer" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(tmp / "tokenizer" / "vocab.txt"), do_lower_case=False).save_pretrained(str(tmp / "tokenizer"))
    tmp.rename(out)
    return out


def _checkpoint(folder: Path, stage: str) -> Path:
    for name in (f"{stage}_2.pt", f"{stage}.pt"):
        if (folder / name).is_file():
            return folder / name
    raise ToolError(f"Bark checkpoint folder {folder} has no {stage}_2.pt or {stage}.pt")


def checkpoint_globals() -> list[Any]:
    """What Bark's checkpoints pickle besides tensors: a NumPy scalar (`best_val_loss`), written by NumPy 1
    as numpy.core.multiarray.scalar. torch >= 2.6 loads with weights_only=True and refuses it (suno-ai/bark
    #626); allowing exactly these globals keeps the safe loader instead of turning it off."""
    import numpy as np

    try:  # NumPy 2 keeps it in numpy._core (numpy.core is a deprecated alias there): the one place we name it
        from numpy._core.multiarray import scalar
    except ImportError:  # NumPy 1
        from numpy.core.multiarray import scalar
    return [scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype, type(np.dtype("f8"))]


# Bark's privates, reached here and nowhere else (bark 0.1.5). Its public loaders (`load_model`,
# `preload_models`) take a model type, look for its checkpoint in Bark's cache directory and download it from
# the Hugging Face hub when missing: a checkpoint folder of our own (the tiny model, a local copy) can only
# be loaded by the private function they call, on the device they would pick.
def load_bark_checkpoint(path: Path, device: str, kind: str) -> Any:
    """One Bark GPT from a checkpoint file: `bark.generation._load_model(ckpt_path, device, model_type)`."""
    from bark import generation

    return generation._load_model(str(path), device, model_type=kind)


def bark_device() -> str:
    """The device Bark's own loaders pick (`bark.generation._grab_best_device`: CUDA, else MPS when Bark's
    environment enables it, else the CPU)."""
    from bark import generation

    return generation._grab_best_device()


def load_folder(folder: Path, device: str) -> dict[str, Any]:
    """Bark's four models from a checkpoint folder, loaded by Bark's and EnCodec's own code."""
    import torch
    from encodec import EncodecModel
    from transformers import BertTokenizer

    models: dict[str, Any] = {}
    for stage in STAGES:
        # _load_model's "text" branch differs from "coarse" only in fetching the tokenizer from the hub by
        # name; load the text GPT the coarse way and give it the folder's tokenizer when there is one.
        kind = "fine" if stage == "fine" else "coarse"
        with torch.serialization.safe_globals(checkpoint_globals()):
            models[stage] = load_bark_checkpoint(_checkpoint(folder, stage), device, kind)
    tokenizer = folder / "tokenizer"
    models["text"] = {"model": models["text"], "tokenizer": BertTokenizer.from_pretrained(
        str(tokenizer) if tokenizer.is_dir() else "bert-base-multilingual-cased")}
    if (folder / "encodec_24khz-d7cc33bc.th").is_file():
        codec = EncodecModel.encodec_model_24khz(repository=folder)
    elif (folder / "encodec_24khz.th").is_file():
        codec = EncodecModel.encodec_model_24khz(pretrained=False)
        codec.load_state_dict(torch.load(folder / "encodec_24khz.th", map_location="cpu"))
    else:
        codec = EncodecModel.encodec_model_24khz()
    codec.set_target_bandwidth(6.0)  # as bark.generation._load_codec_model
    models["codec"] = codec.eval().to(device)
    return models


class BarkVoice:
    """Text -> 24 kHz float audio with Bark. Blocking: call from a worker thread."""

    def __init__(self, model: str | None = None, voice: str | None = None, max_seconds: float | None = None,
                 seed: int = 0) -> None:
        self.model, self.voice, self.max_seconds, self.seed = model, voice, max_seconds, seed
        self._models: dict[str, Any] | None = None

    def _load(self) -> None:
        import torch
        from bark import generation

        key = self.model or "suno/bark"
        if _loaded[0] == key:
            return
        # As the image tool: half the cores, the rest stay with the engine (and on a busy machine two
        # spinning OpenMP threads made the tiny model 8x slower than one).
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
        if self._models is None:
            if key in HUB_MODELS:
                generation.clean_models()
                small = HUB_MODELS[key]
                with torch.serialization.safe_globals(checkpoint_globals()):
                    generation.preload_models(text_use_small=small, coarse_use_small=small, fine_use_small=small)
                self._models = dict(generation.models)
            else:
                folder = build_tiny_bark(tiny_bark_dir()) if key == "tiny" else Path(key).expanduser()
                if not folder.is_dir():
                    raise ToolError(f"Bark checkpoint folder not found: {folder}")
                self._models = load_folder(folder, bark_device())
        generation.models.clear()
        generation.models.update(self._models)
        _loaded[0] = key

    def speak(self, text: str) -> Any:
        """Bark's generate_audio (text -> semantic tokens -> waveform, numpy float32 at SAMPLE_RATE), its two
        steps spelled out so that `max_seconds` reaches the semantic stage (Bark's max_gen_duration_s;
        None is generate_audio exactly)."""
        import torch
        from bark.api import semantic_to_waveform
        from bark.generation import generate_text_semantic

        with _LOCK, torch.random.fork_rng(devices=[]):
            self._load()
            torch.manual_seed(self.seed)  # Bark samples with torch.multinomial: seeded, same text, same audio
            semantic = generate_text_semantic(text, history_prompt=self.voice, silent=True, use_kv_caching=True,
                                              max_gen_duration_s=self.max_seconds)
            if len(semantic) == 0:
                raise ToolError("Bark produced no speech for this text")
            return semantic_to_waveform(semantic, history_prompt=self.voice, silent=True)
