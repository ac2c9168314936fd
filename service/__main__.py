"""`python -m service`: serve the export named by SEMBED_MODEL_DIR on SEMBED_HOST:SEMBED_PORT."""

import logging

import uvicorn

from service.app import create_app
from service.settings import Settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    if not (settings.model_dir / "manifest.json").is_file():
        raise SystemExit(f"{settings.model_dir} is not an export directory (no manifest.json); "
                         "create one with `make export` or set SEMBED_MODEL_DIR")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


if __name__ == "__main__":
    main()
