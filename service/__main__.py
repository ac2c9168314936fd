"""`python -m service`: serve the exports named by SEMBED_MODEL_DIR (or SEMBED_MODELS) on SEMBED_HOST:SEMBED_PORT."""

import logging

import uvicorn

from service.app import create_app
from service.protocol import guarded_protocol
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
    # No access log: uvicorn's costs the event loop about 7% of its time under load.
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info", access_log=False,
                http=guarded_protocol(settings.header_timeout_s))


if __name__ == "__main__":
    main()
