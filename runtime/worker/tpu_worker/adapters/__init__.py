"""Model adapters: one per architecture, all with the same small surface.

An adapter owns a loaded module on one device and dtype and knows how to
  * validate one request into a `Prepared` payload (so bad input fails alone, before batching),
  * run a list of compatible payloads as one batch and split the results back,
  * make synthetic inputs for (batch, seq_len) with a fixed seed (warmup, benchmark, check),
  * report its parameter count and bytes on the device.

Layout: base.py (the surface), text.py, tensor.py, build.py (from files to an adapter).
"""

from __future__ import annotations

from .base import TORCH_DTYPES, Adapter, Output, Prepared, seq_bucket
from .build import build_adapter, read_config
from .tensor import MnistCNN, TensorModel
from .text import CausalLM, SentenceEmbedder

__all__ = [
    "TORCH_DTYPES",
    "Adapter",
    "CausalLM",
    "MnistCNN",
    "Output",
    "Prepared",
    "SentenceEmbedder",
    "TensorModel",
    "build_adapter",
    "read_config",
    "seq_bucket",
]
