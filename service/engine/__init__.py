"""An engine process: admission, the token-budget queue and the backend for one model on one device."""
