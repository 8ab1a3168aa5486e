"""Runs a command with its stderr on a pseudo-terminal, as in an interactive shell, while its
stdin and stdout stay this process's (a pipe: an MCP client's stdio channel). What the command
writes to the terminal is copied to this process's stderr; SIGTERM is passed on to it."""

import os
import pty
import signal
import subprocess
import sys
import threading

master, slave = pty.openpty()
child = subprocess.Popen(sys.argv[1:], stderr=slave)
os.close(slave)
signal.signal(signal.SIGTERM, lambda *_: child.terminate())


def copy() -> None:
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the command closed the terminal
            return
        if not chunk:
            return
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()


reader = threading.Thread(target=copy, daemon=True)
reader.start()
code = child.wait()
reader.join(timeout=5)
sys.exit(code)
