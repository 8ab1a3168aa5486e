"""Who can reach a vLLM server the worker starts: nobody but the worker's own user.

vLLM checks its API key under some path prefixes only (`/v1`, `/inference`, ...); `/invocations`
runs completions without it, and `/tokenize`, `/metrics`, `/docs` answer anyone. So the server
does not listen on TCP at all: it serves HTTP on a Unix domain socket in a directory of the
worker's user that nobody else may enter (0700), and its own processes talk to each other over
ZMQ sockets in the same directory (VLLM_RPC_BASE_PATH). Its worker process also listens on TCP
ports of its own on 127.0.0.1 (torch.distributed's store and gloo, a dozen on a CPU host): the
server runs in a network namespace of its own, where that loopback is not the host's. A path to a
Unix socket crosses network namespaces, so the worker still reaches the HTTP socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import socket
import stat
import struct
import tempfile

from ..errors import WorkerError

SOCKET_NAME = "engine.sock"
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
# sun_path holds 108 bytes; vLLM's ZMQ sockets in the same directory are named by a uuid4 (36).
_MAX_DIR = 60


def private_dir() -> str:
    """A new directory only this user may enter (0700), for the server's sockets. Refused unless
    it is what it must be: a directory of this user that nobody else may enter."""
    base = tempfile.gettempdir()
    if len(base) > _MAX_DIR - 20:
        base = "/tmp"  # a long TMPDIR would push the socket paths past sun_path's 108 bytes
    path = tempfile.mkdtemp(prefix="tpu-mcp-vllm-", dir=base)  # 0700, this user's
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        shutil.rmtree(path, ignore_errors=True)
        raise WorkerError(
            "engine_unavailable",
            f"the vLLM socket directory {path} is not private to this user (mode {oct(st.st_mode & 0o777)})",
        )
    return path


def remove_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def unlink_stale(path: str) -> None:
    """A server that crashed leaves its socket file behind; binding the path again would fail."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def enter_private_network() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Moves the calling process into a new network namespace with its loopback up (and, for a
    user without CAP_SYS_ADMIN, a user namespace that maps only its own uid and gid, so after exec
    it is the same user with no capability). Raises OSError where the system forbids it (systemd's
    RestrictNamespaces, a distribution's restriction of unprivileged user namespaces)."""
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNET | (0 if uid == 0 else _CLONE_NEWUSER)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if flags & _CLONE_NEWUSER:
        # os.open and bytes: nothing here may import (a codec) between fork and exec.
        for name, text in (
            ("setgroups", b"deny"),
            ("uid_map", b"%d %d 1" % (uid, uid)),
            ("gid_map", b"%d %d 1" % (gid, gid)),
        ):
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, text)
            finally:
                os.close(fd)
    # A new namespace's loopback is down: torch.distributed binds 127.0.0.1 in it.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", b"lo", 0)
        flags_now = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags_now | _IFF_UP))
