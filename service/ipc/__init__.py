"""What the API and engine processes exchange, and nothing else."""
