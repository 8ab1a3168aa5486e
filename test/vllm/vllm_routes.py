# Every route a vLLM API server registers, for the command line it runs with: the app is built by
# vLLM's own build_app from the parsed arguments (no engine needed), and its routes (mounts too)
# printed as JSON. Run with vLLM's Python: vllm_routes.py ARG... (the server's arguments).
import json
import sys
import warnings

warnings.simplefilter("ignore")

from starlette.routing import Mount  # noqa: E402
from vllm.entrypoints.launchers.app import build_app  # noqa: E402
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
routes = []


def walk(items, prefix=""):
    for r in items:
        if isinstance(r, Mount):
            routes.append({"path": prefix + r.path, "methods": ["GET"]})
            walk(getattr(r, "routes", None) or [], prefix + r.path)
        else:
            routes.append({"path": prefix + r.path, "methods": sorted(getattr(r, "methods", None) or ["GET"])})


walk(build_app(args, ("generate",)).routes)
print(json.dumps(routes))
