"""Building an adapter from verified files: the module on the CPU, then on the device."""

from __future__ import annotations

import json
import os

import torch

from ..catalog import Catalog, Entry
from ..errors import WorkerError
from ..generation.slots import max_positions
from ..loaders import WeightsInfo, load_state_dict
from ..shapes import ShapePlan, plan_for
from .base import TORCH_DTYPES, Adapter
from .tensor import MnistCNN, TensorModel
from .text import CausalLM, SentenceEmbedder, load_tokenizer, model_chat_template, safe_file, valid_id


def read_config(model_dir: str, catalog: Catalog, entry: Entry) -> dict:
    path = safe_file(model_dir, "config.json", catalog, entry)
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, json.JSONDecodeError):
        raise WorkerError("weights_missing", f"model {entry.id!r}: config.json is unreadable") from None
    if not isinstance(cfg, dict):
        raise WorkerError("weights_missing", f"model {entry.id!r}: config.json is not an object")
    if cfg.get("auto_map"):
        # Custom code would need trust_remote_code, which this worker never enables.
        raise WorkerError("unsafe_weights", f"model {entry.id!r} needs custom code (auto_map); that is refused")
    return cfg


def encoder_max_len(entry: Entry, catalog: Catalog, model_dir: str, cfg: dict) -> int:
    """A sentence-transformer's token limit: the catalog's, within its positions and its
    sentence_bert_config.json max_seq_length."""
    max_len = min(entry.limits.max_seq_len, int(cfg.get("max_position_embeddings", 512)))
    if os.path.isfile(os.path.join(model_dir, "sentence_bert_config.json")):
        try:
            st_path = safe_file(model_dir, "sentence_bert_config.json", catalog, entry)
            with open(st_path, encoding="utf-8") as fh:
                max_len = min(max_len, int(json.load(fh).get("max_seq_length", max_len)))
        except (OSError, ValueError, TypeError):
            pass
    return max_len


def planned(entry: Entry, catalog: Catalog, model_dir: str, cfg: dict | None) -> ShapePlan:
    """The shape plan a load of `entry` from these files would hold (its adapter's), read
    without loading: the token limit as build_adapter gives it to the adapter."""
    if entry.architecture == "mnist-cnn" or cfg is None:
        return plan_for(entry, 0 if entry.architecture == "mnist-cnn" else entry.limits.max_seq_len)
    if entry.architecture == "sentence-transformer":
        return plan_for(entry, encoder_max_len(entry, catalog, model_dir, cfg))
    return plan_for(entry, min(entry.limits.max_seq_len, max_positions(cfg)))


def _hf_model(cls_name: str, model_dir: str, dtype: torch.dtype, entry: Entry):
    import transformers

    # Route transformers' own logger through the JSON bridge and drop its tqdm bars.
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.enable_propagation()
    cls = getattr(transformers, cls_name)
    try:
        return cls.from_pretrained(
            model_dir, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=dtype
        )
    except (OSError, ValueError, KeyError) as exc:
        from .. import logs

        logs.error("transformers load failed", model=entry.id, error=str(exc))
        raise WorkerError(
            "weights_missing",
            f"model {entry.id!r}: the model directory could not be loaded ({type(exc).__name__}); "
            "check its config and weights",
        ) from None


def build_adapter(entry: Entry, catalog: Catalog, info: WeightsInfo, device: torch.device, dtype: str) -> Adapter:
    """Creates the module on the CPU from verified files, then moves it to the device."""
    tdtype = TORCH_DTYPES[dtype]
    if entry.architecture == "mnist-cnn":
        model = MnistCNN()
        state = load_state_dict(info, entry)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise WorkerError(
                "weights_missing",
                f"model {entry.id!r}: weights do not match the mnist-cnn architecture "
                f"(missing {len(missing)}, unexpected {len(unexpected)} tensors)",
            )
        model = model.to(device=device, dtype=tdtype).eval()
        return TensorModel(entry, model, device, dtype)

    if entry.format == "pytorch":
        raise WorkerError("unsafe_weights", f"model {entry.id!r}: text models are loaded from safetensors only")
    cfg = read_config(info.model_dir, catalog, entry)
    tokenizer = load_tokenizer(info.model_dir, catalog, entry)
    if entry.architecture == "sentence-transformer":
        model = _hf_model("AutoModel", info.model_dir, tdtype, entry)
        max_len = encoder_max_len(entry, catalog, info.model_dir, cfg)
        model = model.to(device).eval()
        pad = valid_id(cfg.get("pad_token_id"), int(cfg.get("vocab_size", 1)), 0)
        return SentenceEmbedder(entry, model, device, dtype, tokenizer, max_len, pad)
    model = _hf_model("AutoModelForCausalLM", info.model_dir, tdtype, entry)
    model = model.to(device).eval()
    chat = model_chat_template(info.model_dir, catalog, entry)
    return CausalLM(entry, model, device, dtype, tokenizer, entry.limits.max_seq_len, chat)
