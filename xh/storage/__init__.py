"""Storage: where tables and files live, local or on S3, and how they are handed between stages.

    store = Store.from_config(cfg)             # xh.storage.store: made once per run; its API is `Location`
    graphs = store.at(locations.graphs(cfg, "hotpot"))   # xh.storage.locations: each stage's default place

`uris` turns a URI into a filesystem (one `S3Settings`), `tables` is the commit protocol (staged writes,
`_complete.json`), `partitions` batch scoring's outputs, `jsonfiles` the one JSON / JSON-lines reader.
"""
