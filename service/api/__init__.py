"""An API process: HTTP, auth, validation, tokenisation and answers in front of the engine processes."""
