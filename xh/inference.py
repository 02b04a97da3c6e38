"""Graph rows in, predictions out: the one inference path that training's dev evaluation, the MLflow
pyfunc and batch scoring all share.

    model, tokenizer = load_model(folder)                  # what XHModel.save_pretrained wrote
    predictions = predict_graphs(model, tokenizer, rows)  # rows: `graphs` table rows as dicts

HotpotQA predictions carry `answer`, `answer_doc_id`, `supporting_facts` ([title, sentence]) and
`node_score`; FEVER predictions `label`, `label_probs` and `evidence` ([FEVER page id, line]).
Their official metrics are `xh.eval.official.official_metrics`.

Per-type models (`xh.model.routed`): a folder written by `save_routed` holds one XH model per question
type; `load_model` returns it as a `RoutedModel`, and `predict_graphs` sends each graph row to the model
of its `question_type`, keeping the rows' order. Which architecture a model is, and how it predicts,
is `xh.model.variants`'s to say.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from xh.model.batch import GraphBatch, collate
from xh.model.routed import RoutedModel
from xh.model.variants import architecture, load_saved
from xh.model.xh import XHModel, load_tokenizer


def load_model(folder: str, device: str | torch.device | None = None) -> tuple[XHModel | RoutedModel, object]:
    """(model, tokenizer) of a saved model folder: the one way a model is loaded (a registered version is
    loaded from its data folder, `xh.registry.versions.model_folder`). An XHModel or a DocHopper
    (`xh.model.variants`); a routed folder gives (RoutedModel, None). `device`: None, the GPU when there is one."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_saved(folder, device)
    return model, (load_tokenizer(folder) if model.tokenizer is not None else None)


def predict_graphs(
    model: XHModel,
    tokenizer,
    rows: Iterable[dict],
    *,
    batch_graphs: int = 8,
    bf16: bool = True,
    collect_attention: list | None = None,
    make_batch: Callable[[list], GraphBatch] = collate,
    sp_mode: str | None = None,
    sort_window: int = 8,
) -> list[dict]:
    """Predictions for graph rows, in order. `collect_attention`, when a list, receives
    (EncodedGraph list, GraphBatch, XHOutput) per batch for the hop-attention analysis. `make_batch`:
    how encoded graphs become a batch (`collate`, or packed rows as `xh.train.batching` trains with).
    `sp_mode` overrides the model's supporting-fact mode (`xh.model.decode`).

    Rows are read `sort_window` batches at a time and batched longest node first within that window:
    `collate` pads every node of a batch to its longest node, and graphs of similar lengths together
    pad less (docs/results/scoring.md, batch scoring).
    Predictions do not depend on the batching (padding is masked); they come back in input order.
    DocHopper batches its rows itself (`batch_graphs` questions at a time)."""
    options = dict(
        batch_graphs=batch_graphs,
        bf16=bf16,
        collect_attention=collect_attention,
        make_batch=make_batch,
        sp_mode=sp_mode,
        sort_window=sort_window,
    )
    return architecture(model).predict(model, tokenizer, rows, **options)
