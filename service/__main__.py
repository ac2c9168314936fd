"""`python -m service`: serve the exports named by SEMBED_MODEL_DIR (or SEMBED_MODELS) on SEMBED_HOST:SEMBED_PORT,
as API processes in front of one engine process per model (service/supervisor.py)."""

from service.supervisor import main

if __name__ == "__main__":
    main()
