"""The Ray fleet: a driver that places tpu-mcp worker actors on a Ray cluster.

The control plane starts `python -m tpu_worker.fleet --config FILE` like a local worker and talks
to it with one JSON object per line (see driver.py for the messages). The driver only places,
restarts and counts workers: each actor runs the worker's own `serve` (TCP + mutual TLS + token)
and the control plane connects to that endpoint directly. No request or tensor ever travels
through the driver, Ray's object store or pickle.

Importing this package must not import ray: `__main__` sets Ray's auth and TLS environment first.
"""
