"""`python -m service`: serve the exports named by SEMBED_MODEL_DIR (or SEMBED_MODELS) on SEMBED_HOST:SEMBED_PORT."""

import logging

from service.app import create_app
from service.server import build_server
from service.settings import Settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    access = logging.getLogger("sembed.access")  # bare JSON lines, for log shippers
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access.addHandler(handler)
    access.propagate = False
    if settings.backend == "onnx":
        for _, export_dir in settings.model_dirs():
            if not (export_dir / "manifest.json").is_file():
                raise SystemExit(f"{export_dir} is not an export directory (no manifest.json); "
                                 "create one with `make export` or set SEMBED_MODEL_DIR")
    # uvicorn's access log is off: ours (JSON, with the request id) replaces it.
    build_server(create_app(settings), settings).run()


if __name__ == "__main__":
    main()
