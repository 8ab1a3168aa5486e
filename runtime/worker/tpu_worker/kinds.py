"""Which implementation of served.Served serves a catalog entry (its `engine`): the one place
that knows the kinds of model, so the ops never ask."""

from __future__ import annotations

from .catalog import Entry
from .engines.served import EngineModel
from .served import Served
from .torch_model import TorchModel

KINDS: dict[str, type[Served]] = {"torch": TorchModel, "vllm": EngineModel}


def implementation_for(entry: Entry) -> type[Served]:
    """The implementation serving models of `entry.engine` (catalog.ENGINES)."""
    return KINDS[entry.engine]
