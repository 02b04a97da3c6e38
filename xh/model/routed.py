"""Per-type models (the paper trains bridge and comparison models apart): a folder written by
`save_routed` holds one saved XH model per question type, and a graph row goes to the model of its
`question_type` (from the data, or the question-type classifier at graph building).

    save_routed("out/routed", {"bridge": "out/bridge", "comparison": "out/comparison"})
    model, _ = xh.inference.load_model("out/routed")          # a RoutedModel (xh.model.variants)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROUTED_FILE = "routed.json"
ROUTED_FORMAT = "transformer-xh-routed"
ROUTED_TYPES = ("bridge", "comparison")


class RoutedModel:
    """One (XH model, tokenizer) per question type; a graph goes to the model of its `question_type`."""

    architecture = "routed"  # xh.model.variants
    tokenizer = None  # each model has its own

    def __init__(self, models: dict[str, tuple[object, object]]):
        missing = [t for t in ROUTED_TYPES if t not in models]
        if missing:
            raise ValueError(f"a routed model needs a model per question type; missing: {', '.join(missing)}")
        self.models = models

    @property
    def cfg(self):
        return self.models[ROUTED_TYPES[0]][0].cfg

    def route(self, row: dict) -> str:
        """Rows of no known type go to the bridge model (graph building's default type too)."""
        kind = row.get("question_type")
        return kind if kind in self.models else ROUTED_TYPES[0]

    def eval(self) -> RoutedModel:
        for model, _ in self.models.values():
            model.eval()
        return self


def save_routed(directory: str | Path, folders: dict[str, str | Path]) -> Path:
    """A routed-model folder from one `XHModel.save_pretrained` folder per question type (copied in)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for kind in ROUTED_TYPES:
        shutil.copytree(folders[kind], directory / kind, dirs_exist_ok=True)
    meta = {"format": ROUTED_FORMAT, "version": 1, "types": list(ROUTED_TYPES)}
    (directory / ROUTED_FILE).write_text(json.dumps(meta))
    return directory


def routed_types(directory: str | Path) -> list[str] | None:
    """The question types of a routed folder; None when `directory` is not one."""
    path = Path(directory) / ROUTED_FILE
    if not path.is_file():
        return None
    meta = json.loads(path.read_text())
    if meta.get("format") != ROUTED_FORMAT:
        raise ValueError(f"{directory}/{ROUTED_FILE} is not a {ROUTED_FORMAT} folder")
    return list(meta["types"])
