"""tpu-mcp compute worker: runs PyTorch models for the TypeScript server over a framed pipe.

See runtime/PROTOCOL.md for the wire contract. Importing this package must stay cheap and must
not import torch: `__main__` sets environment switches that TorchTPU reads at import time first.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
