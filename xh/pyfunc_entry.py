"""The registered XH model's pyfunc loader: the `loader_module` its MLmodel names.

MLflow imports this module from the installed `xh` package (a version carries no code) and calls
`_load_pyfunc` with the version's data folder, the saved-model folder of `xh.model.saved`.
"""

from xh.registry import LoadedVersion


def _load_pyfunc(data_path: str) -> LoadedVersion:
    return LoadedVersion(data_path)
