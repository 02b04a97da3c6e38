"""Training on Ray Train: the worker loops of Transformer-XH (`loop`) and of the re-ranker (`rerank`),
what both share (`worker`), the XH loop's state on disk (`state`) and its figures (`figures`)."""
