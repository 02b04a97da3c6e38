"""The MLflow model registry: package a trained model as a pyfunc, register it, gate promotion.

    log_and_register(model_dir, run_id=..., cfg=cfg, metrics=..., graphs_uri=...)   # -> version, @challenger
    version = resolve_model("models:/xh-hotpot@champion")   # {"name", "version", "run_id"}: one version
    model, tokenizer = xh.inference.load_model(model_folder("models:/xh-hotpot/3"))   # the one model loader
    model = load_registered("xh-hotpot", "3")            # what promotion, rollback and scoring load
    model = mlflow.pyfunc.load_model("models:/xh-hotpot@champion")   # `xh.pyfunc_entry`: it answers questions
    model.predict(pd.DataFrame({"id": [...], "question": [...]}))          # rows validated as `PyfuncInput`
    model.predict(pd.DataFrame({"qid": [...], "question": [...], "graph": [json.dumps(graph_row)]}))
    decision = promote("xh-hotpot", eval_rows, metric="f1", min_delta=0.5, floor=0.0, missed=quarantined_ids)
    rollback("xh-hotpot")

(`xh.stages.promote` runs a promotion: its evaluation set, an actor pool per version, its MLflow run.)

One module per concern:

    pyfunc       the pyfunc's input rows (`PyfuncInput`), its signature, a version loaded from its data folder
    register     logging a model folder with its pipeline record as a version (`log_and_register`, `pipeline_of`)
    versions     looking a version up by alias or number, and loading it (`resolve_model`, `load_registered`)
    evaluation   the evaluation set (the gate split, or a named set checked against both models' training),
                 its graph-setting check, a version's predictions and official metrics
    lock         the registry lock a promotion or rollback holds while it moves the alias
    champion     `promote` and `rollback`: moving `@champion`, with its history

A version's files are data only: the safetensors weights, tokenizer and config (the saved-model folder,
the pyfunc's `data`), its MLmodel, signature and requirements; no code. Its pyfunc is MLflow's `loader_module`
flavour naming `xh.pyfunc_entry`, which MLflow imports from the installed `xh` package. Promotion, rollback and
scoring go further (`load_registered`): they read MLmodel as YAML only to find the data folder, and build the
model with this package's classes, so that nothing written to the artifact store (a `code/` folder, a python
file, a pickle, another loader module in a rewritten MLmodel) ever runs with the job's credentials. Serving the
pyfunc (`mlflow models serve`) therefore needs the project installed: its requirements pin the project's own
distribution, so any environment manager rebuilds it (or the image, or `--env-manager local`).
Promotion evaluates `@challenger` and `@champion` on the same rows and moves `@champion` only when the
challenger wins by `min_delta` points (the first model, or one facing an unloadable champion, must pass
`floor`); the move is a compare-and-swap under the registry lock (`xh.registry.lock`), and every version it
replaces is appended to the registered model's tag `champion_history`, whose last `rollback` restores (a
trailing entry naming the current champion, left by a promotion killed inside the lock, is dropped).
"""
