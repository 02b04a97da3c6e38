from xh.retrieval.evaluate import normalize_answer, retrieval_report


def test_recall_measures_per_type():
    docs = {"a": ("Alpha", "Alpha was born in Paris."), "b": ("Beta", "Beta is a band."), "c": ("Gamma", "x")}
    questions = [
        {
            "qid": "1",
            "type": "bridge",
            "answer": "Paris",
            "supporting_facts": [{"title": "Alpha", "sent": 0}, {"title": "Beta", "sent": 0}],
        },
        {"qid": "2", "type": "comparison", "answer": "yes", "supporting_facts": [{"title": "Gamma", "sent": 0}]},
    ]
    candidates = [
        {"qid": "1", "doc_id": "b", "source": "ir", "rank": 0},
        {"qid": "1", "doc_id": "c", "source": "ir", "rank": 1},
        {"qid": "1", "doc_id": "a", "source": "ir", "rank": 2},
        {"qid": "1", "doc_id": "a", "source": "exp", "rank": 0},
        {"qid": "2", "doc_id": "c", "source": "el", "rank": 0},
    ]
    report = retrieval_report(questions, candidates, docs, ir_keep=2, ks=(2, 5))
    bridge = report["bridge"]
    assert bridge["supp_recall@2"] == 0.0 and bridge["supp_recall@5"] == 1.0
    assert bridge["ans_recall@2"] == 0.0 and bridge["ans_recall@5"] == 1.0
    assert bridge["graph.supp_recall"] == 1.0 and bridge["graph.nodes"] == 3.0
    comparison = report["comparison"]
    assert comparison["span_answers"] == 0 and "ans_recall@2" not in comparison  # yes/no is in no paragraph
    assert comparison["supp_recall@5"] == 0.0 and comparison["graph.supp_recall"] == 1.0
    assert report["all"]["questions"] == 2 and report["all"]["supp_recall@5"] == 0.5


def test_answer_matching_uses_official_normalisation_and_whole_words():
    assert normalize_answer("The  Beatles!") == "beatles"
    docs = {"a": ("A", "The party was in Art City.")}
    q = [{"qid": "1", "type": "bridge", "answer": "art", "supporting_facts": []}]
    report = retrieval_report(q, [{"qid": "1", "doc_id": "a", "source": "ir", "rank": 0}], docs, ks=(2,))
    assert report["all"]["ans_recall@2"] == 1.0
    q[0]["answer"] = "par"
    report = retrieval_report(q, [{"qid": "1", "doc_id": "a", "source": "ir", "rank": 0}], docs, ks=(2,))
    assert report["all"]["ans_recall@2"] == 0.0
