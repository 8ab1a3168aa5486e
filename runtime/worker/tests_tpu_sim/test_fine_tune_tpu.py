"""Issue 47 (item 4): the fine-tune's trainers on the simulated host (the real torch-tpu wheel,
only the chip faked; no kernel runs on `tpu` here). Each configuration of work "fine_tune" is
built by fine_tune.trainer_for: in mode "compile_step" it hands the whole step to torch.compile,
as TorchTPU patched it, with the backend the platform object chooses for the device ("tpu"), and
AdamW (the fine-tune's optimizer) capturable at the fine-tune's learning rate."""

from __future__ import annotations

import json
import subprocess

from conftest import WORKER_DIR, make_env

SCRIPT = r"""
import json, torch, torch_tpu._loader as L
from transformers import GPT2Config, GPT2LMHeadModel
from tpu_worker import adapters
from tpu_worker.bench import fine_tune
seen = []
def fake_compile(*a, **k):
    seen.append({"target": getattr(a[0], "__name__", type(a[0]).__name__),
                 "backend": k.get("backend"), "dynamic": k.get("dynamic")})
    return a[0]
L._torch_compile = fake_compile
source = object.__new__(adapters.CausalLM)
source.device = torch.device("tpu:0")
source.eager_model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
whole = fine_tune.trainer_for(source, "bfloat16", "compile_step", 3e-5)
split = fine_tune.trainer_for(source, "float32", "compile", 3e-5)
print(json.dumps({
    "seen": seen, "backend": whole.compile_backend, "platform": type(whole.platform).__name__,
    "capturable": whole.optimizer.defaults["capturable"], "lr": whole.optimizer.defaults["lr"],
    "scope": whole.compile_scope, "split_backend": split.compile_backend,
    "loss": type(whole.module).__name__,
}))
"""


def test_a_fine_tunes_whole_step_compiles_for_the_tpu(tpu_python, sim_host):
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-c", SCRIPT], env=make_env(sim_host), capture_output=True, text=True, timeout=300, cwd=WORKER_DIR
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["platform"] == "TpuPlatform" and out["backend"] == "tpu" and out["split_backend"] == "tpu"
    # The whole step of the compile_step trainer, then the model-and-loss module of the split one.
    assert out["seen"] == [
        {"target": "_update", "backend": "tpu", "dynamic": False},
        {"target": "CausalLMLoss", "backend": "tpu", "dynamic": False},
    ]
    assert out["capturable"] is True and out["lr"] == 3e-5 and out["scope"].startswith("whole step")
    assert out["loss"] == "CausalLMLoss"
