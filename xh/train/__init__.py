"""Training Transformer-XH on Ray Train: the worker loop (`loop`), its state on disk (`state`)."""
