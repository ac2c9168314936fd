"""HTTP routers, one per API family; each only validates, calls the engine and shapes the answer."""
