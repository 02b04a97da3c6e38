"""DocHopper (xh.model.dochopper): the hop equations on hand cases, hop supervision, precomputed
embeddings, training, save/load.

The model tests use a tiny random BERT (2 layers x 32) with the real all-MiniLM-L6-v2 tokenizer, saved
to a temporary folder so that `DocHopper.from_backbone` loads it as it loads a real checkpoint.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from xh.model.dochopper.config import DocHopperConfig, evidence_hops
from xh.model.dochopper.equations import hop_loss, mix_paragraphs, mix_sentences, paragraph_embeddings, table_log_probs
from xh.model.dochopper.examples import hop_targets, supporting_evidence
from xh.model.dochopper.model import DocHopper

# --- the equations on hand cases ----------------------------------------------------------------------


def test_eq3_paragraph_embedding_is_the_query_weighted_sum_of_its_sentences():
    q = torch.tensor([[1.0, 0.0]])
    sentences = torch.tensor([[[[2.0, 0.0], [0.0, 1.0], [9.0, 9.0]]]])  # [B=1, P=1, S=3, H=2]; the third is padding
    mask = torch.tensor([[[True, True, False]]])
    p, alpha = paragraph_embeddings(q, sentences, mask)
    # q·s = (2, 0) -> α = (e² / (e² + 1), 1 / (e² + 1)), padding 0
    a0, a1 = math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)
    assert alpha[0, 0].tolist() == pytest.approx([a0, a1, 0.0])
    assert p[0, 0].tolist() == pytest.approx([2 * a0, a1])
    _, scaled = paragraph_embeddings(q, sentences, mask, scale=0.5)  # q·s / 2 = (1, 0)
    assert scaled[0, 0, 0].item() == pytest.approx(math.e / (math.e + 1))


def linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return layer


def test_eq4_mixes_a_sentence_with_the_query_by_a_linear_map_of_their_concatenation():
    mix = linear([[1, 0, 1, 0], [0, 2, 0, -1]], [0.5, 0.0])
    q = torch.tensor([[1.0, 2.0]])
    s = torch.tensor([[[[3.0, 4.0]]]])
    # W [q ; s] + b = (1 + 3 + 0.5, 2·2 - 4) = (4.5, 0)
    assert mix_sentences(mix, q, s)[0, 0, 0].tolist() == pytest.approx([4.5, 0.0])


def test_eq5_6_mix_a_paragraph_over_its_sentences_with_the_eq3_weights():
    mix = linear([[1, 0, 1, 0], [0, 1, 0, 1]], [0.0, 0.0])  # W [x ; s] = x + s
    v = torch.tensor([0.0, 1.0])
    q = torch.tensor([[2.0, 2.0]])
    s = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    alpha = torch.tensor([[[0.25, 0.75]]])
    mask = torch.ones(1, 1, 2, dtype=torch.bool)
    # k_0 = 0.25 q + s_0 = (1.5, 0.5), k_1 = 0.75 q + s_1 = (1.5, 2.5); v·k = (0.5, 2.5) -> β = softmax
    b0, b1 = 1 / (1 + math.exp(2)), math.exp(2) / (1 + math.exp(2))
    out = mix_paragraphs(mix, v, q, s, alpha, mask)
    assert out[0, 0].tolist() == pytest.approx([1.5 * b0 + 1.5 * b1, 0.5 * b0 + 2.5 * b1])


def test_a_one_sentence_paragraph_mixes_exactly_like_that_sentence():
    # the paper's remark: Eq. 6 reduces to Eq. 4 when |p_i| = 1 (α = β = 1)
    torch.manual_seed(0)
    mix, v = nn.Linear(8, 4), torch.randn(4)
    q, s = torch.randn(1, 4), torch.randn(1, 1, 1, 4)
    p, alpha = paragraph_embeddings(q, s, torch.ones(1, 1, 1, dtype=torch.bool))
    assert torch.equal(p, s[:, :, 0])
    torch.testing.assert_close(
        mix_paragraphs(mix, v, q, s, alpha, torch.ones(1, 1, 1, dtype=torch.bool)), mix_sentences(mix, q, s)[:, :, 0]
    )


def test_hop_loss_is_cross_entropy_against_the_positives_of_the_whole_table():
    scores = torch.tensor([[[1.0, 2.0, 0.0], [0.5, 9.0, 9.0]]])  # P=2, entries (paragraph, s0, s1)
    valid = torch.tensor([[[True, True, True], [True, True, False]]])
    log_p = table_log_probs(scores, valid)
    z = math.exp(1) + math.exp(2) + math.exp(0) + math.exp(0.5) + math.exp(9)
    assert log_p[0, 0, 1].item() == pytest.approx(2 - math.log(z), abs=1e-5)
    targets = torch.zeros(1, 2, 3, dtype=torch.bool)
    targets[0, 0, 1] = targets[0, 1, 1] = True  # two positives: each counts one half
    expected = -0.5 * ((2 - math.log(z)) + (9 - math.log(z)))
    assert hop_loss(log_p, targets).item() == pytest.approx(expected, abs=1e-5)


# --- hop supervision from a graph row -----------------------------------------------------------------


def node(title: str, sentences: list[str], support: list[int] | None = None) -> dict:
    return {
        "doc_id": title.lower(),
        "title": title,
        "sentences": sentences,
        "source": "context",
        "supporting_sentences": support or [],
        "is_evidence": bool(support),
    }


def bridge_row() -> dict:
    return {
        "qid": "q1",
        "task": "hotpot",
        "question": "Which city is the capital of the country where Alpha was born?",
        "question_type": "bridge",
        "answer": "Paris",
        "answer_type": "span",
        # the data names the answer paragraph first; the hops read it last
        "supporting_facts": [
            {"title": "France", "sent": 1},
            {"title": "Alpha", "sent": 0},
            {"title": "France", "sent": 2},
        ],
        "nodes": [
            node("Gamma", ["Gamma is a river.", " It is long."]),
            node("Alpha", ["Alpha was born in France.", " Alpha sings."], [0]),
            node("France", ["France is a country.", " Its capital is Paris.", " Paris is large."], [1, 2]),
        ],
        "edges": [],
    }


def test_hop_targets_follow_the_supporting_facts_with_the_answer_paragraph_last():
    row = bridge_row()
    assert supporting_evidence(row) == [(1, [0]), (2, [1, 2])]
    hops = ("paragraph", "sentence", "paragraph", "sentence")
    assert hop_targets(row, hops) == [(1, []), (1, [0]), (2, []), (2, [1, 2])]
    assert evidence_hops(hops) == [(0, 1), (2, 3)]


def test_without_the_answer_in_a_supporting_sentence_the_datas_order_stands():
    row = bridge_row() | {"answer": "yes", "answer_type": "yes", "question_type": "comparison"}
    assert [n for n, _ in supporting_evidence(row)] == [2, 1]
    row = bridge_row()
    row["nodes"][1] = node("Alpha", ["Alpha was born in France.", " Alpha sings."], [])  # one paragraph only
    assert hop_targets(row, ("paragraph", "sentence", "paragraph", "sentence")) == [
        (2, []),
        (2, [1, 2]),
        (-1, []),
        (-1, []),
    ]


# --- the model on a tiny backbone ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_backbone(make_tiny_backbone) -> str:
    return make_tiny_backbone(layers=2, max_positions=256)


def make_model(backbone: str, seed: int = 0, **overrides) -> DocHopper:
    torch.manual_seed(seed)
    return DocHopper.from_backbone(DocHopperConfig(backbone=backbone, max_paragraph_tokens=48, **overrides))


def toy_rows() -> list[dict]:
    second = bridge_row() | {
        "qid": "q2",
        "question": "Where does the river Delta flow to?",
        "answer": "the sea",
        "supporting_facts": [{"title": "Delta", "sent": 1}, {"title": "Beta", "sent": 1}],
    }
    second["nodes"] = [
        node("Delta", ["Delta is a river.", " It flows to the sea."], [1]),
        node("Beta", ["Beta was born in Spain.", " Beta sings about Delta."], [1]),
        node("Spain", ["Spain is a country.", " Its capital is Madrid.", " Madrid is large."]),
    ]
    return [bridge_row(), second]


def test_hop_supervision_marks_the_right_table_entries(tiny_backbone):
    model = make_model(tiny_backbone)
    batch = model.collate(model.prepare([bridge_row()]))
    positives = [torch.nonzero(batch.targets[0, t]).tolist() for t in range(4)]
    # entry 0 is the paragraph itself, entry 1 + j its sentence j
    assert positives == [[[1, 0]], [[1, 1]], [[2, 0]], [[2, 2], [2, 3]]]
    assert batch.has_target.tolist() == [[True] * 4]
    assert model.gold_combination(batch.examples[0]) == ((1, 0), (2, 1))  # France's sentence 1 holds "Paris"


def test_the_query_update_adds_the_soft_mix_of_the_table_to_the_next_query(tiny_backbone):
    # Eq. 7 on a hand case: one paragraph with s0 = (1, 0), s1 = (0, 1); q_0 = (ln 3, 0); W [x ; s] = x + s; v = 0
    model = make_model(tiny_backbone, scale_scores=False)
    hidden = 2
    model.mix = linear([[1, 0, 1, 0], [0, 1, 0, 1]], [0.0, 0.0])
    model.mix_vector = nn.Parameter(torch.zeros(hidden))
    q0, q1 = torch.tensor([math.log(3), 0.0]), torch.tensor([0.0, 1.0])
    queries = torch.stack([q0, q1]).unsqueeze(0)  # [1, T=2, 2]
    sentences = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    mask, valid = torch.ones(1, 1, 2, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)
    table, used = model.attend(queries, sentences, mask, valid)

    alpha = torch.tensor([0.75, 0.25])  # softmax(ln 3, 0)
    p = alpha[0] * sentences[0, 0, 0] + alpha[1] * sentences[0, 0, 1]
    assert table[0, 0, 0].tolist() == pytest.approx([float(q0 @ p), math.log(3), 0.0])
    a = torch.softmax(table[0, 0, 0], dim=0)  # weights of (paragraph, s0, s1)
    mix_p = 0.5 * (alpha[0] * q0 + sentences[0, 0, 0]) + 0.5 * (alpha[1] * q0 + sentences[0, 0, 1])  # β = 1/2 (v = 0)
    mix_s0, mix_s1 = q0 + sentences[0, 0, 0], q0 + sentences[0, 0, 1]
    expected_q1 = q1 + a[0] * mix_p + a[1] * mix_s0 + a[2] * mix_s1
    assert used[0, 1].tolist() == pytest.approx(expected_q1.tolist(), abs=1e-6)

    model.cfg.query_update = False  # the ablation: q_1 as encoded
    assert model.attend(queries, sentences, mask, valid)[1][0, 1].tolist() == pytest.approx(q1.tolist())


def assert_same_predictions(a: list[dict], b: list[dict]) -> None:
    """Equal answers and facts; scores equal up to float rounding (different padding, same tokens)."""
    assert [{k: v for k, v in p.items() if k not in ("score", "node_score")} for p in a] == [
        {k: v for k, v in p.items() if k not in ("score", "node_score")} for p in b
    ]
    assert [p["score"] for p in a] == pytest.approx([p["score"] for p in b], abs=1e-4)


def test_precomputed_corpus_embeddings_give_the_same_predictions_as_inline_encoding(tiny_backbone):
    model = make_model(tiny_backbone).eval()
    examples = model.prepare(toy_rows())
    paragraphs = {doc: (title, sents) for e in examples for doc, title, sents in zip(e.doc_ids, e.titles, e.sentences)}
    corpus = dict(zip(paragraphs, model.encode_corpus(list(paragraphs.values()), batch_size=2)))
    inline = model.encode_sentences(model.collate(examples))
    stored = model.collate(examples, corpus).sentence_embeddings
    torch.testing.assert_close(stored, inline, atol=1e-5, rtol=1e-5)
    assert_same_predictions(model.predict(examples), model.predict(examples, corpus))
    prediction = model.predict(examples)[0]
    assert prediction["qid"] == "q1" and len(prediction["supporting_facts"]) == 2
    titles = {title for title, _ in prediction["supporting_facts"]}
    assert len(titles) == 2  # two sentences of two different paragraphs


def test_a_few_training_steps_lower_the_loss(tiny_backbone):
    model = make_model(tiny_backbone).train()
    batch = model.collate(model.prepare(toy_rows()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, hop = [], []
    for _ in range(5):
        out = model(batch)
        assert set(out.losses) == {"hop", "rerank", "span", "answer_type"}
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
        hop.append(out.losses["hop"].item())
    assert losses[-1] < 0.75 * losses[0] and hop[-1] < 0.75 * hop[0]
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_save_and_load_give_the_same_model(tiny_backbone, tmp_path):
    model = make_model(tiny_backbone, sentence_pooling="first", top_k=2).eval()
    examples = model.prepare(toy_rows())
    model.save_pretrained(tmp_path / "dh")
    loaded = DocHopper.from_pretrained(tmp_path / "dh")
    assert loaded.cfg == model.cfg and loaded.cfg.hops == ("paragraph", "sentence", "paragraph", "sentence")
    assert_same_predictions(loaded.predict(examples), model.predict(examples))
    with pytest.raises(ValueError, match="not a saved DocHopper"):
        DocHopper.from_pretrained(tmp_path)


def test_eq8_scores_each_evidence_and_the_top_combinations_skip_pairs_in_one_paragraph(tiny_backbone):
    model = make_model(tiny_backbone, top_k=2)  # λ = (0.7, 0.0)
    table = torch.zeros(1, 4, 2, 3)  # [B, hops, P=2, (paragraph, s0, s1)]
    table[0, 0, :, 0] = torch.tensor([1.0, 0.0])  # hop 1: paragraph scores
    table[0, 1, :, 1:] = torch.tensor([[0.5, 0.2], [0.4, 0.1]])  # hop 2: sentence scores
    table[0, 2, :, 0] = torch.tensor([0.0, 2.0])
    table[0, 3, :, 1:] = torch.tensor([[3.0, 0.0], [1.0, 2.0]])
    scores = model.evidence_scores(table, torch.ones(1, 2, 2, dtype=torch.bool))
    # evidence 1: s + 0.7 p = ((1.2, 0.9), (0.4, 0.1)); evidence 2: s + 0 p
    assert scores[0, 0].tolist() == [pytest.approx([1.2, 0.9]), pytest.approx([0.4, 0.1])]
    assert scores[0, 1].tolist() == [[3.0, 0.0], [1.0, 2.0]]
    # top 2 of each: (0,0) 1.2, (0,1) 0.9 and (0,0) 3, (1,1) 2; pairs inside paragraph 0 are skipped
    combos = model.combinations(scores, 0)
    assert [c for _, c in combos] == [((0, 0), (1, 1)), ((0, 1), (1, 1))]
    assert [s for s, _ in combos] == pytest.approx([3.2, 2.9])
