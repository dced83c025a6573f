"""`image` (type image): Stable Diffusion through diffusers.

`model` names a diffusers Stable Diffusion pipeline (a local folder, or a hub id for users with a hub
and weights). The offline default, `tiny`, is a small pipeline with the real Stable Diffusion
architecture (UNet2DCondition + AutoencoderKL + CLIP text encoder + DDIM) built locally with seeded
random weights, so every code path of a real model runs; its pictures are noise. Built once into
`$INFERCEPT_HOME/models/tiny-sd`.

Returns a PNG artifact and a one-line description of fixed form (the paper returned a short
fixed-length description to the model too).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from augmentations.base import Artifact, CallContext, ToolError, ToolResult
from augmentations.workers import WorkerPool
from engine_adapter.paths import infercept_home


def tiny_pipeline_dir() -> Path:
    return infercept_home() / "models" / "tiny-sd"


def build_tiny_pipeline(out: Path, seed: int = 0) -> Path:
    """Write a small random-weight Stable Diffusion pipeline to `out` (idempotent)."""
    if (out / "model_index.json").is_file():
        return out
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    torch.manual_seed(seed)
    # A byte-level CLIP vocabulary (every byte as a word piece and as a word end) with no merges: the
    # real CLIP tokenizer code, character granularity, no downloaded vocabulary.
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"],
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=len(vocab),
    ))
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=4, norm_num_groups=16,
    )
    vae = AutoencoderKL(
        block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=16,
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
    )
    pipe = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, scheduler=DDIMScheduler(steps_offset=1, clip_sample=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    tmp = out.with_name(out.name + ".tmp")
    pipe.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


class ImageGen:
    name = "Image"
    aug_type = "image"
    description = "draw a picture; the argument describes the image"

    def __init__(self, model: str = "tiny", steps: int = 4, size: int = 64, seed: int = 0, max_prompt_chars: int = 300) -> None:
        self.model, self.steps, self.size, self.seed = model, steps, size, seed
        self.max_prompt_chars = max_prompt_chars
        self._pipe: Any = None
        # diffusers pipelines are not thread-safe: one worker thread owns it.
        # A fresh worker after a hang or a crash builds its own (the old one may still hold it).
        self._pool = WorkerPool("image", on_replace=lambda: setattr(self, "_pipe", None))

    def _load(self) -> Any:
        if self._pipe is None:
            import torch
            from diffusers import StableDiffusionPipeline

            torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
            path = str(build_tiny_pipeline(tiny_pipeline_dir())) if self.model == "tiny" else self.model
            self._pipe = StableDiffusionPipeline.from_pretrained(path)
            self._pipe.set_progress_bar_config(disable=True)
        return self._pipe

    def _generate(self, prompt: str, seed: int) -> bytes:
        import torch

        pipe = self._load()
        image = pipe(
            prompt, num_inference_steps=self.steps, height=self.size, width=self.size,
            generator=torch.Generator().manual_seed(seed),
        ).images[0]
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return buf.getvalue()

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        prompt = " ".join(args.strip().strip("'\"").split())
        if not prompt:
            raise ToolError("Image needs a description of the picture")
        if len(prompt) > self.max_prompt_chars:
            raise ToolError(f"the description is {len(prompt)} characters; at most {self.max_prompt_chars}")
        png = await self._pool.run(self._generate, prompt, self.seed)
        short = prompt if len(prompt) <= 60 else prompt[:57] + "..."
        return ToolResult(
            f"An image of {short} ({self.size}x{self.size} PNG).",
            artifacts=(Artifact("image", "image/png", png),),
        )

    async def close(self) -> None:
        self._pool.close()
