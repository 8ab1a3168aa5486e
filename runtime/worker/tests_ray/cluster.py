"""A real local Ray cluster for tests: token auth, a head without TPUs and simulated v6e hosts.

As a module: `start(tmp)` / `stop(handle)` (used by conftest.py). As a script (used by the
TypeScript e2e test): `python cluster.py DIR` starts the cluster and the worker-channel
certificates in DIR, prints one JSON line {address, ray_token_file, ca, cert, key, token_file,
catalog}, waits for stdin to close, then stops everything and checks that no raylet/gcs_server
is left. Only in a loopback-only network namespace (scripts/test-ray.sh).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import secrets
import subprocess
import sys
import time

WORKER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(WORKER_DIR))
CHIPS_PER_HOST = 2
HOSTS = 2


def only_loopback() -> bool:
    # /proc/net/dev lists the interfaces of this process's network namespace (sysfs may not)
    try:
        with open("/proc/net/dev", encoding="ascii") as fh:
            names = [ln.split(":", 1)[0].strip() for ln in fh.readlines()[2:]]
    except OSError:
        return False
    return names == ["lo"]


def pem_pair(tmp: pathlib.Path, name: str, subject: str, issuer=None, issuer_key=None, ca=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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
    )
    if not ca:  # the control plane's certificate: `serve` accepts only clientAuth ones
        cert = cert.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = cert.sign(issuer_key or key, hashes.SHA256())
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert, key, str(cert_path), str(key_path)


def make_channel(tmp: pathlib.Path) -> dict:
    """The control plane's side of the worker channel: a CA, a client certificate it signed, a token."""
    tmp.mkdir(parents=True, exist_ok=True)
    ca, ca_key, ca_path, _ = pem_pair(tmp, "ca", "tpu-mcp test CA", ca=True)
    _, _, cert_path, key_path = pem_pair(tmp, "client", "control-plane", issuer=ca.subject, issuer_key=ca_key)
    token = tmp / "token"
    token.write_text(secrets.token_hex(24) + "\n")
    token.chmod(0o600)
    return {"ca": ca_path, "cert": cert_path, "key": key_path, "token_file": str(token)}


def make_catalog(tmp: pathlib.Path) -> str:
    sys.path.insert(0, WORKER_DIR)
    from tpu_worker import builtin

    shared = os.path.join(REPO, ".data", "models")
    if not all(builtin.is_valid(os.path.join(shared, n)) for n, _ in builtin.BUILDERS):
        shared = str(tmp / "models")
        builtin.build_all(shared)
    with open(os.path.join(REPO, "runtime", "catalog.builtin.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    data["model_roots"] = [shared]
    path = tmp / "catalog.json"
    path.write_text(json.dumps(data))
    return str(path)


def start(tmp: pathlib.Path):
    """Head (no TPU) + HOSTS simulated v6e hosts with CHIPS_PER_HOST chips each, token auth on."""
    token_file = tmp / "ray-token"
    token_file.write_text(secrets.token_hex(32) + "\n")
    token_file.chmod(0o600)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    # Ray workers import the actor class (tpu_worker.fleet.actor) by name: the nodes need the package.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (WORKER_DIR, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **small})
    pod = f"v6e-{CHIPS_PER_HOST * HOSTS}"
    for i in range(HOSTS):
        resources = {"TPU": CHIPS_PER_HOST, "accelerator_type:TPU-V6E": 1}
        if i == 0:
            resources[f"TPU-{pod}-head"] = 1  # what Ray gives worker 0 of a real slice
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
    return cluster, str(token_file)


def ray_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,comm"], capture_output=True, text=True, check=True).stdout
    return [ln.strip() for ln in out.splitlines() if any(n in ln for n in ("raylet", "gcs_server"))]


def stop(cluster) -> list[str]:
    """Stops the cluster; returns any raylet/gcs_server still running after 20 s (should be none)."""
    cluster.shutdown()
    deadline = time.monotonic() + 20
    while (left := ray_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def main() -> int:
    if not only_loopback():
        print("refusing: run in a loopback-only network namespace (scripts/test-ray.sh)", file=sys.stderr)
        return 2
    tmp = pathlib.Path(sys.argv[1])
    tmp.mkdir(parents=True, exist_ok=True)
    channel = make_channel(tmp / "channel")
    catalog = make_catalog(tmp)
    cluster, token_file = start(tmp)
    print(
        json.dumps({"address": cluster.address, "ray_token_file": token_file, "catalog": catalog, **channel}),
        flush=True,
    )
    sys.stdin.read()  # until the test closes our stdin (or dies)
    left = stop(cluster)
    if left:
        print(f"Ray processes left: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
