"""Graph rows -> EncodedGraph: node layout, truncation, offsets and labels; the real sample through MiniLM."""

import numpy as np
import pytest

from xh.config import GraphsConfig
from xh.graph.encode import encode_graph, encode_graphs, truncate_node
from xh.graph.hotpot import distractor_graphs, read_distractor_questions
from xh.retrieval.evaluate import normalize_answer


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


def _node(sentences, anchors=(), spans=None, support=None, evidence=None, title="T", line=-1):
    return {
        "doc_id": title,
        "title": title,
        "sentences": list(sentences),
        "anchors": list(anchors),
        "source": "ir",
        "score": 1.0,
        "line": line,
        "answer_spans": spans,
        "supporting_sentences": support,
        "is_evidence": evidence,
    }


def _row(nodes, question="where was bo lind born?", edges=((0, 1),), **labels):
    return {
        "qid": "q",
        "task": labels.pop("task", "hotpot"),
        "question": question,
        "question_type": "bridge",
        "answer": None,
        "answer_type": None,
        "claim_label": None,
        "supporting_facts": None,
        "nodes": nodes,
        "edges": [{"src": s, "dst": d} for s, d in edges],
        "edge_mode": "hyperlink",
        **labels,
    }


def _text(tokenizer, ids):
    return tokenizer.convert_ids_to_tokens([int(i) for i in ids])


def test_node_layout_labels_and_offsets(tokenizer):
    para = ["Bo Lind was born in Parva.", " Parva is small."]
    nodes = [
        _node(["Arden Works is a firm."], evidence=False, support=[], spans=[]),
        _node(
            para,
            anchors=["Bo Lind", "founder"],
            spans=[{"start": 20, "end": 25}, {"start": 27, "end": 32}],
            support=[1],
            evidence=True,
        ),
    ]
    enc = encode_graph(_row(nodes, answer="Parva", answer_type="span"), tokenizer, 64)
    assert enc.num_nodes == 2 and enc.edges.tolist() == [[0, 1]]
    tokens = _text(tokenizer, enc.input_ids[1])
    assert tokens == [
        "[CLS]",
        "where",
        "was",
        "bo",
        "lin",
        "##d",
        "born",
        "?",
        "[SEP]",
        "bo",
        "lin",
        "##d",
        "[SEP]",
        "founder",
        "[SEP]",
        "bo",
        "lin",
        "##d",
        "was",
        "born",
        "in",
        "par",
        "##va",
        ".",
        "par",
        "##va",
        "is",
        "small",
        ".",
        "[SEP]",
    ]
    first_paragraph = tokens.index("[SEP]", 13) + 1
    assert enc.token_type_ids[1].tolist() == [0] * first_paragraph + [1] * (len(tokens) - first_paragraph)
    assert enc.paragraph_mask[1].tolist() == [False] * first_paragraph + [True] * (
        len(tokens) - first_paragraph - 1
    ) + [False]
    assert enc.sentence_ids[1][first_paragraph:-1].tolist() == [0] * 9 + [1] * 5
    # every occurrence, row 0 the first in the evidence node; spans decode back through the offsets
    assert enc.answer_spans.tolist() == [[1, 21, 22], [1, 24, 25]]
    for node, start, end in enc.answer_spans:
        assert enc.node_paragraphs[node][enc.offsets[node][start][0] : enc.offsets[node][end][1]] == "Parva"
    assert enc.node_has_answer.tolist() == [0, 1] and enc.node_relevance.tolist() == [0, 1]
    assert enc.num_sentences.tolist() == [1, 2]
    assert [s.tolist() for s in enc.sentence_labels] == [[0], [0, 1]]
    assert enc.answer_type == 0 and enc.question_type == 0 and enc.claim_label == -1
    assert (enc.offsets[1][:first_paragraph] == -1).all()


def test_unknown_labels_are_minus_one(tokenizer):
    enc = encode_graph(_row([_node(["A b."]), _node(["C d."])], question_type=None), tokenizer, 32)
    assert enc.node_relevance.tolist() == [-1, -1] and enc.node_has_answer.tolist() == [-1, -1]
    assert enc.answer_spans.shape == (0, 3) and enc.answer_type == -1 and enc.question_type == -1
    assert [s.tolist() for s in enc.sentence_labels] == [[-1], [-1]]


def test_truncation_trims_the_longer_side_and_keeps_separators(tokenizer):
    assert truncate_node(5, [3, 4], 100, 40) == (5, [3, 4], 23)  # paragraph longer: it loses its end
    assert truncate_node(5, [30, 40], 10, 40) == (5, [21], 10)  # anchors longer: the last anchor goes first
    assert truncate_node(50, [], 3, 20) == (14, [], 3)  # then the question
    assert truncate_node(5, [3], 10, 40) == (5, [3], 10)  # fits: nothing cut
    a, p = truncate_node(10, [10], 100, 64)[1:]
    assert 1 + 10 + 1 + 11 + p + 1 == 64 and a == [10]

    sentences = [f"Sentence number {k} talks about Parva. " for k in range(40)]
    spans = [{"start": s + 29, "end": s + 34} for s in np.cumsum([0] + [len(x) for x in sentences[:-1]])]
    node = _node(sentences, anchors=["Bo Lind"], spans=spans, support=[0, 39], evidence=True)
    enc = encode_graph(_row([node], edges=(), answer="Parva", answer_type="span"), tokenizer, 48)
    ids = enc.input_ids[0]
    assert len(ids) == 48 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert (ids == tokenizer.sep_token_id).sum() == 3  # question, anchor and paragraph separators all kept
    assert _text(tokenizer, ids)[12:17] == ["[SEP]", "sentence", "number", "0", "talks"]  # paragraph keeps its start
    kept = enc.num_sentences[0]
    assert 1 <= kept < 40 and enc.sentence_labels[0].tolist() == [1] + [0] * (kept - 1)  # sentence 39 was cut
    kept_end = enc.offsets[0][enc.paragraph_mask[0]][:, 1].max()
    assert len(enc.answer_spans) == sum(s["end"] <= kept_end for s in spans) > 0  # spans cut off are dropped
    for _, start, end in enc.answer_spans:
        assert enc.node_paragraphs[0][enc.offsets[0][start][0] : enc.offsets[0][end][1]] == "Parva"


def test_roberta_style_specials_and_fever_rows():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>", "Soul", "Food", "is", "a", "film", "(", ")", "."]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token="<s>", sep_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    node = _node(
        ["Soul Food is a film ."],
        anchors=["Soul Food (film)"],
        title="Soul Food (film)",
        line=3,
        support=[0],
        evidence=True,
    )
    row = _row([node], question="Soul Food is a film", edges=(), task="fever", claim_label="SUPPORTS")
    enc = encode_graph(row, tok, 32)
    assert tok.convert_ids_to_tokens(enc.input_ids[0].tolist()) == [
        "<s>",
        "Soul",
        "Food",
        "is",
        "a",
        "film",
        "</s>",
        "Soul",
        "Food",
        "(",
        "film",
        ")",
        "</s>",
        "Soul",
        "Food",
        "is",
        "a",
        "film",
        ".",
        "</s>",
    ]
    assert enc.task == "fever" and enc.claim_label == 0 and enc.node_lines.tolist() == [3]
    assert enc.node_relevance.tolist() == [1] and enc.edges.shape == (0, 2)


@pytest.mark.shared_data
def test_real_sample_answer_spans_decode_to_the_answer(shared_data, tokenizer):
    items, _ = read_distractor_questions(str(shared_data / "hotpotqa/hotpot_train_sample500.json"))
    graphs = [o.graph for o in distractor_graphs(items, GraphsConfig()) if o.graph]
    spans = answer_nodes = 0
    for graph in graphs:
        enc = encode_graph(graph, tokenizer, 512)
        gold = normalize_answer(graph["answer"])
        for node, start, end in enc.answer_spans:
            paragraph = enc.node_paragraphs[node]
            assert normalize_answer(paragraph[enc.offsets[node][start][0] : enc.offsets[node][end][1]]) == gold
            assert enc.paragraph_mask[node][start] and enc.paragraph_mask[node][end] and start <= end
            spans += 1
        answer_nodes += int((enc.node_has_answer == 1).sum())
        assert set(enc.answer_spans[:, 0].tolist()) == set(np.flatnonzero(enc.node_has_answer == 1).tolist())
        if graph["answer_type"] == "span":  # the target is in a gold paragraph whenever one holds the answer
            assert len(enc.answer_spans)
            gold_holds = bool(((enc.node_has_answer == 1) & (enc.node_relevance == 1)).any())
            assert enc.node_relevance[enc.answer_spans[0, 0]] == int(gold_holds)
        # supporting-sentence labels sit on tokens of the named sentence
        for i, node in enumerate(graph["nodes"]):
            for s in np.flatnonzero(enc.sentence_labels[i] == 1):
                starts = enc.offsets[i][enc.sentence_ids[i] == s][:, 0]
                assert (
                    node["sentences"][s]
                    .strip()
                    .lower()
                    .startswith(enc.node_paragraphs[i][starts.min() : starts.min() + 5].lower())
                )
    assert spans > answer_nodes >= 475  # every span answer has a node; several hold it more than once


def test_a_pyarrow_table_of_rows_encodes_like_its_dicts(tokenizer):
    import pyarrow as pa

    rows = [
        _row([_node(["Bo Lind was born in Oslo."]), _node(["Oslo is a city."])], qid="a"),
        _row([_node(["Nothing."])], edges=(), qid="b"),
    ]
    from_dicts = encode_graphs(rows, tokenizer, 64)
    from_table = encode_graphs(pa.Table.from_pylist(rows), tokenizer, 64)
    assert [g.qid for g in from_table] == [g.qid for g in from_dicts]
    for a, b in zip(from_table, from_dicts):
        assert all(np.array_equal(x, y) for x, y in zip(a.input_ids, b.input_ids))
