"""Graph rows in, predictions out: the one inference path that training's dev evaluation, the MLflow
pyfunc and batch scoring all share.

    model, tokenizer = load_model(folder)                  # what XHModel.save_pretrained wrote
    predictions = predict_graphs(model, tokenizer, rows)  # rows: `graphs` table rows as dicts

HotpotQA predictions carry `answer`, `answer_doc_id`, `supporting_facts` ([title, sentence]) and
`node_score`; FEVER predictions `label`, `label_probs` and `evidence` ([FEVER page id, line]).
`fever_gold(rows)` and `fever_prediction_file(predictions)` are the official FEVER scorer's two files
(`xh.eval.fever.evaluate_fever`), as `hotpot_gold` / `hotpot_prediction_file` are HotpotQA's.

Per-type models (the paper trains bridge and comparison models apart): a folder written by
`save_routed` holds one XH model per question type; `load_model` returns it as a `RoutedModel`, and
`predict_graphs` sends each graph row to the model of its `question_type` (from the data, or the
question-type classifier at graph building), keeping the rows' order.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch

from xh.graph.encode import encode_graph
from xh.model import GraphBatch, XHModel, collate, decode, load_tokenizer

ROUTED_FILE = "routed.json"
ROUTED_FORMAT = "transformer-xh-routed"
ROUTED_TYPES = ("bridge", "comparison")


class RoutedModel:
    """One (XH model, tokenizer) per question type; a graph goes to the model of its `question_type`."""

    def __init__(self, models: dict[str, tuple[XHModel, object]]):
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


def load_model(directory: str, device: str | torch.device = "cpu") -> tuple[XHModel | RoutedModel, object]:
    """(model, tokenizer) of a saved model folder: an XHModel or a DocHopper (`xh.model.variants`); a
    routed folder gives (RoutedModel, None)."""
    from xh.model.variants import load_saved

    if (Path(directory) / ROUTED_FILE).is_file():
        meta = json.loads((Path(directory) / ROUTED_FILE).read_text())
        if meta.get("format") != ROUTED_FORMAT:
            raise ValueError(f"{directory}/{ROUTED_FILE} is not a {ROUTED_FORMAT} folder")
        return RoutedModel({t: load_model(str(Path(directory) / t), device) for t in meta["types"]}), None
    model = load_saved(directory).to(device)
    model.eval()
    return model, load_tokenizer(directory)


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast on GPUs; CPU stays fp32 (faster and exact there)."""
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


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
    pad less (docs/results.md, batch scoring).
    Predictions do not depend on the batching (padding is masked); they come back in input order."""
    from xh.model.dochopper import DocHopper

    if isinstance(model, DocHopper):  # its own batches; paragraph embeddings from its corpus cache
        return model.predict_rows(list(rows), batch_size=batch_graphs)
    if isinstance(model, RoutedModel):
        rows = list(rows)
        kinds = [model.route(row) for row in rows]
        by_kind: dict[str, list[dict]] = {}
        options = dict(
            batch_graphs=batch_graphs,
            bf16=bf16,
            collect_attention=collect_attention,
            make_batch=make_batch,
            sp_mode=sp_mode,
            sort_window=sort_window,
        )
        for kind, (sub, sub_tokenizer) in model.models.items():
            picked = [row for row, k in zip(rows, kinds) if k == kind]
            by_kind[kind] = predict_graphs(sub, sub_tokenizer, picked, **options) if picked else []
        position = {kind: iter(predictions) for kind, predictions in by_kind.items()}
        return [next(position[kind]) for kind in kinds]
    device = next(model.parameters()).device
    cfg = model.cfg
    predictions: list[dict] = []
    window: list[dict] = []

    def run(graphs: list) -> list[dict]:
        batch = make_batch(graphs).to(device)
        with torch.inference_mode(), autocast(device, bf16):
            output = model(batch)
        if collect_attention is not None:
            collect_attention.append((graphs, batch, output))
        return decode(
            graphs,
            batch,
            output,
            cfg.max_answer_tokens,
            sp_mode=sp_mode or cfg.sp_mode,
            by_span=not cfg.node_prediction,
        )

    def flush() -> None:
        graphs = [encode_graph(row, tokenizer, cfg.max_node_tokens) for row in window]
        order = sorted(range(len(graphs)), key=lambda k: -max(map(len, graphs[k].input_ids)))
        out: list[dict | None] = [None] * len(graphs)
        for start in range(0, len(order), batch_graphs):
            picked = order[start : start + batch_graphs]
            for k, prediction in zip(picked, run([graphs[k] for k in picked])):
                out[k] = prediction
        predictions.extend(out)
        window.clear()

    model.eval()
    for row in rows:
        window.append(row)
        if len(window) == batch_graphs * sort_window:
            flush()
    if window:
        flush()
    return predictions


def hotpot_gold(rows: Sequence[dict], missed: Sequence[str] = ()) -> list[dict]:
    """Graph rows as the official evaluation script's gold records. `missed`: ids of questions that got
    no graph (quarantined); they join the gold with no prediction, so they score 0 on every metric, as
    the official script scores a question without a prediction (their other gold fields do not matter)."""
    gold = [
        {
            "_id": r["qid"],
            "answer": r["answer"],
            "type": r.get("question_type"),
            "supporting_facts": [[sf["title"], sf["sent"]] for sf in (r.get("supporting_facts") or [])],
        }
        for r in rows
    ]
    known = {g["_id"] for g in gold}
    return gold + [
        {"_id": qid, "answer": "", "type": "quarantined", "supporting_facts": []} for qid in missed if qid not in known
    ]


def hotpot_prediction_file(predictions: Sequence[dict]) -> dict:
    """Predictions in the official script's format: {"answer": {qid: text}, "sp": {qid: [[title, sent]]}}."""
    return {
        "answer": {p["qid"]: p["answer"] for p in predictions},
        "sp": {p["qid"]: [list(sf) for sf in p["supporting_facts"]] for p in predictions},
    }


def fever_gold(rows: Sequence[dict]) -> list[dict]:
    """FEVER graph rows as the official scorer's gold lines: `evidence` groups of
    [annotation_id, evidence_id, page, line] (NOT ENOUGH INFO: no groups)."""
    return [
        {
            "id": r["qid"],
            "label": r["claim_label"],
            "evidence": [[[None, None, s["page"], s["line"]] for s in group] for group in (r.get("evidence") or [])],
        }
        for r in rows
    ]


def fever_prediction_file(predictions: Sequence[dict]) -> list[dict]:
    """FEVER predictions in the official format, one per claim in the same order:
    {"id", "predicted_label", "predicted_evidence": [[page_id, line], ...]} (at most 5, by importance)."""
    return [
        {"id": p["qid"], "predicted_label": p["label"], "predicted_evidence": [list(e) for e in p["evidence"]]}
        for p in predictions
    ]
