"""Question type (bridge / comparison) from the question text alone: a small model beside XHModel.

Graph building needs the type of every HotpotQA question (comparison questions get a fully connected
graph and no expansion). The data gives it when present; new questions get it from this classifier.

    from xh.model.qtype import QuestionTypeClassifier, evaluate
    clf = QuestionTypeClassifier.train(questions, types, backbone="path/or/name")
    clf.predict(["Who was born first, Ada Lovelace or Alan Turing?"])      # ["comparison"]
    clf.predict_proba(questions)                                           # float32 [n, 2], QUESTION_TYPES order
    evaluate(clf, questions, types)          # accuracy, per-class precision / recall / f1, confusion counts
    clf.save("runs/qtype"); clf = QuestionTypeClassifier.load("runs/qtype")
    # graph building asks it only for questions whose type the data lacks (xh.graph.hotpot)

    xh qtype --questions hotpot_train.json --output runs/qtype     # the stage that trains it (`xh.stages.qtype`)

The model: the backbone is loaded as XHModel loads it (`AutoModel.from_pretrained`, float32, the same
tokenizer loader) and stays frozen. A question's features are the mean over its tokens of every
encoder layer's hidden states, concatenated (6 × 384 for all-MiniLM-L6-v2): the middle layers carry
the wording ("which ... first", "both", "X or Y") better than the last one, which a sentence
encoder trains towards topic. On top sits a logistic regression (standardised features, L2 penalty,
full-batch L-BFGS from zeros, so training is deterministic); the penalty is chosen on a seeded 10%
of the training questions, then the head is refit on all of them. Fine-tuning the last layer as
well was tried on HotpotQA (7,205 dev questions): no better held-out accuracy, several times slower.

Saved folder: the saved-model format of `xh.model.saved` (no pickle anywhere; `load` reads JSON and
safetensors only):

    qtype.json          format, backbone name/path, a fingerprint of its weights, pooling, training figures
    model.safetensors   head.mean and head.scale of the features, head.weight [2, F], head.bias [2];
                        backbone.* (`save(..., include_backbone=True)`, the default)
    config.json, tokenizer files    the backbone's, when it is included

The backbone is copied by default so that the folder is self-contained: a cluster node or an MLflow
artifact has no hub and not the trainer's paths (all-MiniLM-L6-v2 adds 90 MB). With
`include_backbone=False` only the head is written (a few kB) and `load` reloads the backbone by its
recorded name or path; either way the weights' fingerprint must match, or `load` refuses in one line.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xh.graph.encoded import QUESTION_TYPES
from xh.inputs.questions import _quarantine
from xh.model.saved import load_encoder_model, load_tokenizer, pretrained_backbone, save_encoder_model

CONFIG_FILE = "qtype.json"
FORMAT = "xh-question-type"
FORMAT_VERSION = 1
L2_GRID = (1e-3, 3e-3, 1e-2, 3e-2)  # penalties tried on the validation slice, weakest first
VALIDATION_FRACTION = 0.1
MIN_VALIDATION = 20  # below this many validation questions the choice is noise: use DEFAULT_L2
DEFAULT_L2 = 1e-2


@dataclass
class QuestionTypeConfig:
    backbone: str  # name or path the backbone was loaded from (reloaded from it when not saved alongside)
    backbone_sha256: str  # fingerprint of the backbone's weights: a different backbone is refused at load
    layers: list[int]  # indices into the model's hidden_states (0 = embeddings) whose token means are features
    max_length: int = 64
    batch_size: int = 64
    l2: float = DEFAULT_L2
    seed: int = 0
    labels: tuple[str, ...] = QUESTION_TYPES
    train_questions: int = 0
    train_seconds: float = 0.0
    validation_accuracy: dict[str, float] | None = None  # per L2 value tried


# --- the backbone: loading, fingerprint, features ------------------------------------------------------


def load_backbone(name_or_path: str | Path):
    """(tokenizer, frozen model in eval mode), loaded as XHModel.from_backbone loads them."""
    tokenizer = load_tokenizer(name_or_path)
    model = pretrained_backbone(name_or_path)
    model.eval().requires_grad_(False)
    return tokenizer, model


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the names and bytes of every parameter and buffer, in state_dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def question_features(
    tokenizer, model, questions: Sequence[str], layers: Sequence[int], *, batch_size: int, max_length: int
) -> torch.Tensor:
    """float32 [n, len(layers) × hidden]: per question, the token mean of each chosen layer, concatenated."""
    hidden = model.config.hidden_size
    features = torch.zeros(len(questions), len(layers) * hidden)
    # Questions of similar length share a batch, so little of each batch is padding.
    order = sorted(range(len(questions)), key=lambda i: len(questions[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = tokenizer(
                [questions[i] for i in rows], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            out = model(**batch, output_hidden_states=True)
            mask = batch["attention_mask"].unsqueeze(-1).to(torch.float32)
            means = [(out.hidden_states[k] * mask).sum(1) / mask.sum(1) for k in layers]
            features[rows] = torch.cat(means, dim=1)
    return features


# --- the head: logistic regression -------------------------------------------------------------------


def fit_logistic_regression(
    features: torch.Tensor, labels: torch.Tensor, l2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [C, F], bias [C]) minimising mean cross-entropy + l2·|weight|², full-batch L-BFGS from zeros."""
    num_classes = len(QUESTION_TYPES)
    weight = torch.zeros(num_classes, features.shape[1], requires_grad=True)
    bias = torch.zeros(num_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = features @ weight.T + bias
        loss = torch.nn.functional.cross_entropy(logits, labels) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach(), bias.detach()


def _label_ids(types: Sequence[str]) -> torch.Tensor:
    unknown = sorted({str(t) for t in types if t not in QUESTION_TYPES})
    if unknown:
        raise ValueError(f"unknown question types {unknown[:5]}; expected one of {list(QUESTION_TYPES)}")
    return torch.tensor([QUESTION_TYPES.index(t) for t in types], dtype=torch.int64)


def _choose_l2(features: torch.Tensor, labels: torch.Tensor, seed: int) -> tuple[float, dict[str, float] | None]:
    """The L2 penalty of best accuracy on a seeded validation slice (ties: the stronger penalty)."""
    n_val = int(len(labels) * VALIDATION_FRACTION)
    if n_val < MIN_VALIDATION:
        return DEFAULT_L2, None
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    val, fit = perm[:n_val], perm[n_val:]
    scores: dict[str, float] = {}
    best = (-1.0, DEFAULT_L2)
    for l2 in L2_GRID:
        weight, bias = fit_logistic_regression(features[fit], labels[fit], l2)
        accuracy = ((features[val] @ weight.T + bias).argmax(1) == labels[val]).double().mean().item()
        scores[repr(l2)] = round(accuracy, 6)
        best = max(best, (accuracy, l2))  # the grid grows, so an equal accuracy moves to the stronger penalty
    return best[1], scores


# --- the classifier ----------------------------------------------------------------------------------


class QuestionTypeClassifier:
    def __init__(self, config: QuestionTypeConfig, tokenizer, backbone, head: dict[str, torch.Tensor]):
        self.config = config
        self.tokenizer = tokenizer
        self.backbone = backbone
        self.head = head  # mean [F], scale [F], weight [C, F], bias [C]

    @classmethod
    def train(
        cls,
        questions: list[str],
        types: list[str],
        backbone: str,
        *,
        seed: int = 0,
        batch_size: int = 64,
        max_length: int = 64,
        l2: float | None = None,
    ) -> QuestionTypeClassifier:
        """Fit the head on frozen backbone features; `l2=None` chooses the penalty on a validation slice."""
        if len(questions) != len(types):
            raise ValueError(f"{len(questions)} questions but {len(types)} types")
        labels = _label_ids(types)
        missing = [t for i, t in enumerate(QUESTION_TYPES) if not (labels == i).any()]
        if missing:
            raise ValueError(f"training needs questions of every type; none of type {missing}")
        started = time.perf_counter()
        tokenizer, model = load_backbone(backbone)
        layers = list(range(1, model.config.num_hidden_layers + 1))
        features = question_features(tokenizer, model, questions, layers, batch_size=batch_size, max_length=max_length)
        mean, scale = features.mean(0), features.std(0).clamp_min(1e-6)
        standard = (features - mean) / scale
        scores = None
        if l2 is None:
            l2, scores = _choose_l2(standard, labels, seed)
        weight, bias = fit_logistic_regression(standard, labels, l2)
        config = QuestionTypeConfig(
            backbone=str(backbone),
            backbone_sha256=weights_fingerprint(model),
            layers=layers,
            max_length=max_length,
            batch_size=batch_size,
            l2=l2,
            seed=seed,
            train_questions=len(questions),
            train_seconds=round(time.perf_counter() - started, 2),
            validation_accuracy=scores,
        )
        return cls(config, tokenizer, model, {"mean": mean, "scale": scale, "weight": weight, "bias": bias})

    def predict_proba(self, questions: Sequence[str]) -> np.ndarray:
        """float32 [n, 2]: p(bridge), p(comparison) per question (columns in QUESTION_TYPES order)."""
        cfg = self.config
        features = question_features(
            self.tokenizer, self.backbone, questions, cfg.layers, batch_size=cfg.batch_size, max_length=cfg.max_length
        )
        logits = ((features - self.head["mean"]) / self.head["scale"]) @ self.head["weight"].T + self.head["bias"]
        return torch.softmax(logits, dim=1).numpy()

    def predict(self, questions: Sequence[str]) -> list[str]:
        return [QUESTION_TYPES[i] for i in self.predict_proba(questions).argmax(1)]

    def save(self, directory: str | Path, *, include_backbone: bool = True) -> Path:
        weights = {f"head.{name}": tensor for name, tensor in self.head.items()}
        if include_backbone:
            weights |= {f"backbone.{name}": tensor for name, tensor in self.backbone.state_dict().items()}
        meta = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "backbone_saved": include_backbone,
            "config": asdict(self.config),
        }
        save_encoder_model(
            directory,
            CONFIG_FILE,
            meta,
            weights,
            backbone=self.backbone if include_backbone else None,
            tokenizer=self.tokenizer if include_backbone else None,
        )
        return Path(directory)

    @classmethod
    def load(cls, directory: str | Path) -> QuestionTypeClassifier:
        """What `save` wrote; the backbone from the folder, else from its recorded name, fingerprint checked."""
        saved = load_encoder_model(directory, CONFIG_FILE, FORMAT, FORMAT_VERSION, what="question-type classifier")
        meta = saved.config
        config = QuestionTypeConfig(**{**meta["config"], "labels": tuple(meta["config"]["labels"])})
        if config.labels != QUESTION_TYPES:
            raise ValueError(f"{directory}: labels {list(config.labels)} differ from {list(QUESTION_TYPES)}")
        if meta.get("backbone_saved"):
            source, tokenizer, model = str(directory), saved.tokenizer, saved.new_backbone()
            model.load_state_dict(saved.tensors("backbone."), strict=True)
        else:
            source = config.backbone
            tokenizer, model = load_backbone(source)
        model.eval().requires_grad_(False)
        if weights_fingerprint(model) != config.backbone_sha256:
            raise ValueError(f"backbone {source!r} is not the one the classifier in {directory} was trained on")
        return cls(config, tokenizer, model, saved.tensors("head."))


# --- evaluation --------------------------------------------------------------------------------------


def evaluate(classifier: QuestionTypeClassifier, questions: Sequence[str], types: Sequence[str]) -> dict:
    """accuracy, per class precision / recall / f1 / support, and confusion[true][predicted] counts."""
    gold = _label_ids(types).tolist()
    predicted = [QUESTION_TYPES.index(t) for t in classifier.predict(questions)]
    confusion = {t: {p: 0 for p in QUESTION_TYPES} for t in QUESTION_TYPES}
    for g, p in zip(gold, predicted):
        confusion[QUESTION_TYPES[g]][QUESTION_TYPES[p]] += 1
    per_class = {}
    for t in QUESTION_TYPES:
        hits = confusion[t][t]
        support = sum(confusion[t].values())
        predicted_as = sum(confusion[g][t] for g in QUESTION_TYPES)
        precision = hits / predicted_as if predicted_as else 0.0
        recall = hits / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class[t] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    correct = sum(confusion[t][t] for t in QUESTION_TYPES)
    return {
        "questions": len(gold),
        "accuracy": correct / len(gold) if gold else 0.0,
        "per_class": per_class,
        "confusion": confusion,
    }


# --- labelled question files -----------------------------------------------------------------------------


def labelled_questions(records: Any, source: str) -> tuple[list[dict], list[dict]]:
    """HotpotQA-format records -> (rows {key, question, type}, quarantine rows); every record lands in exactly
    one. A row's `key` places it in or out of the held-out split (`xh.train.split.in_dev_split`, training's
    rule): the record's `_id`, or its question text where it has none (HotpotQA's simplified files)."""
    if not isinstance(records, list):
        raise ValueError(f"{source} is not a HotpotQA question file (a JSON array of questions)")
    rows, quarantined = [], []
    for position, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            reason = "invalid record: not an object"
        elif not isinstance(record.get("question"), str) or not record["question"].strip():
            reason = "missing question"
        elif record.get("type") is None:
            reason = "missing type"
        elif record["type"] not in QUESTION_TYPES:
            reason = f"unknown type {str(record['type'])[:40]!r}"
        else:
            text = record["question"].strip()
            rows.append({"key": str(record.get("_id") or text), "question": text, "type": record["type"]})
            continue
        quarantined.append(_quarantine(source, position, reason, record))
    return rows, quarantined
