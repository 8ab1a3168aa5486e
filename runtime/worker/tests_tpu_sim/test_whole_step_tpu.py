"""Issue 42 (item 7): the training step TorchTPU's compile guide recommends, on the simulated host
(the real torch-tpu wheel, only the chip faked; no kernel runs on `tpu` here). Mode
"compile_step" hands the whole step (forward, loss, backward, optimizer) to torch.compile, as
TorchTPU patched it, with the backend the platform object chooses for the device ("tpu"), and
builds AdamW capturable; the model itself is not compiled apart."""

from __future__ import annotations

import json
import subprocess

from conftest import WORKER_DIR, make_env

SCRIPT = r"""
import json, torch, torch_tpu._loader as L
from tpu_worker import adapters
from tpu_worker.bench import train_bench, train_step
from tpu_worker.bench.host import ProcHost
from tpu_worker.bench.stability import Goal
from tpu_worker.cancel import CancelToken
seen = []
def fake_compile(*a, **k):
    seen.append({"target": getattr(a[0], "__name__", type(a[0]).__name__),
                 "backend": k.get("backend"), "dynamic": k.get("dynamic")})
    return a[0]
L._torch_compile = fake_compile
source = object.__new__(adapters.TensorModel)
source.device, source.eager_model = torch.device("tpu:0"), adapters.MnistCNN()
adamw = train_step.Trainer(source, "float32", train_step.WHOLE_STEP, "adamw")
# The compile is stubbed (the step runs on the host): SGD, which captures nothing, runs its steps.
sgd = train_step.Trainer(source, "float32", train_step.WHOLE_STEP, "sgd")
g = torch.Generator().manual_seed(0)
batch = {"x": torch.randn((2, 1, 28, 28), generator=g), "labels": torch.tensor([1, 7])}
res = train_bench.measure_train(
    sgd, batch, warmup=1, goal=Goal(3, None, 1, 10, 60.0), host=ProcHost(), token=CancelToken()
)
print(json.dumps({
    "seen": seen, "backend": adamw.compile_backend, "platform": type(adamw.platform).__name__,
    "capturable": adamw.optimizer.defaults["capturable"], "scope": adamw.compile_scope,
    "steps": res["train_steps"], "loss": [res["loss_first"], res["loss_final"]],
}))
"""


def test_the_whole_step_compiles_for_the_tpu_with_a_capturable_optimizer(tpu_python, sim_host):
    p = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [tpu_python, "-c", SCRIPT], env=make_env(sim_host), capture_output=True, text=True, timeout=300, cwd=WORKER_DIR
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["platform"] == "TpuPlatform" and out["backend"] == "tpu"
    # One torch.compile per trainer, of the whole step, never of the model alone.
    assert out["seen"] == [{"target": "_update", "backend": "tpu", "dynamic": False}] * 2
    assert out["capturable"] is True and out["scope"].startswith("whole step")
    assert out["steps"] == 4 and out["loss"][0] != out["loss"][1]
