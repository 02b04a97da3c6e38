"""Each stage of the pipeline as a library call: `run(cfg, store) -> summary`, without the CLI or Ray set-up.

The drivers in `workflows/` read the config, join Ray and call these; the demo composes them."""
