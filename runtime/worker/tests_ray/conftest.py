"""A real local Ray cluster with token auth, on loopback only, with simulated TPU hosts.

Run through `npm run test:ray` (scripts/test-ray.sh): it puts pytest in a network namespace of its
own with only `lo`, where Ray settles on 127.0.0.1 and no packet can leave the machine. These tests
refuse to run anywhere else.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import sys
import time

import pytest

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(WORKER_DIR))
sys.path.insert(0, WORKER_DIR)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (WORKER_DIR, os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

CHIPS_PER_HOST = 2
HOSTS = 2


def _only_loopback() -> bool:
    # /proc/net/dev lists the interfaces of this process's network namespace (sysfs may not)
    try:
        with open("/proc/net/dev", encoding="ascii") as fh:
            names = [ln.split(":", 1)[0].strip() for ln in fh.readlines()[2:]]
    except OSError:
        return False
    return names == ["lo"]


def pytest_configure(config):
    if not _only_loopback():
        raise pytest.UsageError(
            "the Ray tests must run in a network namespace with only loopback: use `npm run test:ray` "
            "(scripts/test-ray.sh), never on the machine's own interfaces"
        )


def _pem_pair(tmp, name, subject, issuer=None, issuer_key=None, ca=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subj = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subj)
        .issuer_name(issuer or subj)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(issuer_key or key, hashes.SHA256())
    )
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key, str(cert_path), str(key_path)


@pytest.fixture(scope="session")
def channel(tmp_path_factory):
    """The control plane's side of the worker channel: a CA, a client certificate it signed, a token."""
    tmp = tmp_path_factory.mktemp("channel")
    ca, ca_key, ca_path, _ = _pem_pair(tmp, "ca", "tpu-mcp test CA", ca=True)
    _, _, cert_path, key_path = _pem_pair(tmp, "client", "control-plane", issuer=ca.subject, issuer_key=ca_key)
    token = tmp / "token"
    token.write_text(secrets.token_hex(24) + "\n")
    token.chmod(0o600)
    return {"ca": ca_path, "cert": cert_path, "key": key_path, "token_file": str(token)}


@pytest.fixture(scope="session")
def catalog_path(tmp_path_factory):
    from tpu_worker import builtin

    shared = os.path.join(REPO, ".data", "models")
    if not all(builtin.is_valid(os.path.join(shared, n)) for n, _ in builtin.BUILDERS):
        shared = str(tmp_path_factory.mktemp("models"))
        builtin.build_all(shared)
    with open(os.path.join(REPO, "runtime", "catalog.builtin.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [shared]
    path = tmp_path_factory.mktemp("catalog") / "catalog.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """Head (no TPU) + two simulated v6e hosts with 2 chips each, token auth on."""
    tmp = tmp_path_factory.mktemp("ray")
    token_file = tmp / "ray-token"
    token_file.write_text(secrets.token_hex(32) + "\n")
    token_file.chmod(0o600)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **small})
    pod = f"v6e-{CHIPS_PER_HOST * HOSTS}"
    for i in range(HOSTS):
        resources = {"TPU": CHIPS_PER_HOST, "accelerator_type:TPU-V6E": 1, "slice-a": 1}
        if i == 0:
            resources[f"TPU-{pod}-head"] = 1
        cluster.add_node(
            num_cpus=1,
            resources=resources,
            labels={
                "ray.io/tpu-slice-name": "slice-a",
                "ray.io/tpu-worker-id": str(i),
                "ray.io/tpu-pod-type": pod,
                "ray.io/accelerator-type": "TPU-V6E",
            },
            env_vars={"TPU_NAME": "slice-a", "TPU_WORKER_ID": str(i), "TPU_ACCELERATOR_TYPE": pod},
            **small,
        )
    cluster.wait_for_nodes()
    yield {"address": cluster.address, "token_file": str(token_file), "tmp": tmp}
    cluster.shutdown()
    _assert_no_ray_left()


def _assert_no_ray_left() -> None:
    deadline = time.monotonic() + 20
    while True:
        out = subprocess.run(["ps", "-eo", "pid,comm"], capture_output=True, text=True, check=True).stdout
        left = [ln for ln in out.splitlines() if any(n in ln for n in ("raylet", "gcs_server"))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"Ray processes left after the cluster stopped: {left}"
