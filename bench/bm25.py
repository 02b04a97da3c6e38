"""Benchmark: the project's exact BM25 against rank-bm25 (the reference) and bm25s (the fast peer), same run.

    .venv/bin/python bench/bm25.py --hotpot ../shared/data/hotpotqa/hotpot_train_sample500.json
    .venv/bin/python bench/bm25.py --hotpot FILE --synthetic-docs 5000 --rank-bm25-queries 50

The corpus: the context paragraphs of a HotpotQA-format file (title + text, one document per
title) plus N generated paragraphs from `xh.synth` (default: enough for 20,000 documents); the
queries: the file's questions. Every system gets the same token lists from `xh.retrieval.analyzer`.

    qps_project       queries/s of `BM25Shard.search` (top 10), all queries in one batched call
    qps_project_k100  the same for the top 100 (the paper's BM25 depth)
    latency_ms_p50    one query per call, median
    qps_rank_bm25     `BM25Okapi.get_scores` + `np.argsort` (how its users take a top 10), per query
    qps_bm25s         `bm25s.BM25.retrieve` (top 10, all queries in one call, its default numpy backend)
    qps_bm25s_numba   the same with bm25s's numba backend (one thread, as the others), where numba is
                      installed (`pip install -e '.[bench]'`); its JIT compile is left to the warm-up
    ratio             qps_project / qps_rank_bm25       (target >= 500)
    ratio_vs_bm25s    qps_project / qps_bm25s           (target >= 1.0)
    ratio_vs_bm25s_numba  qps_project / qps_bm25s_numba
    bm25s_numba_same_top10  on every run, the numba backend's top-10 scores are the numpy backend's (1e-6)
    top10_identical   on every run, the project's top 10 is rank-bm25's for every query checked, ties aware: same
                      length, scores within 1e-6 of rank-bm25's sorted scores, and every returned
                      document's rank-bm25 score within 1e-6 of the score returned
    build_seconds     CorpusStats + BM25Shard.build from token lists (analysis timed apart)
    bytes_per_doc     size of the saved shard (all files) / documents
    memory_bytes_per_doc  the searchable shard's arrays in memory (CSR + frequent terms' dense rows)

The three systems are measured `--runs` times (default 5) in one process, each run checked for exact
scores; the throughputs and ratios are reported as min and median over the runs (and the ratios per
run), since other work on the machine moves them. Within a run, the fast systems' timed sections are
repeated (`--repeat`) and the best kept. bm25s and numba are benchmark-only dependencies (the `bench`
extra).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

import numpy as np

TOLERANCE = 1e-6


def hotpot_corpus(hotpot: Path) -> tuple[list[str], list[str], list[str]]:
    """(doc ids, texts, questions) of a HotpotQA-format file: one document per context title."""
    records = json.loads(hotpot.read_text())
    paragraphs: dict[str, str] = {}
    for record in records:
        for title, sentences in record["context"]:
            paragraphs.setdefault(title, title + " " + "".join(sentences))
    return [f"hotpot:{t}" for t in paragraphs], list(paragraphs.values()), [r["question"] for r in records]


def synthetic_texts(n: int, start: int = 0, stop: int | None = None):
    """(doc ids, texts) of generated pages start..stop of a world of n pages (`xh.synth`, seed 13)."""
    from xh.synth import MIN_DOCS, WorldSpec, page

    spec = WorldSpec(num_docs=max(n, MIN_DOCS), seed=13)
    ids, texts = [], []
    for i in range(start, n if stop is None else stop):
        p = page(spec, i)
        ids.append(f"synth:{p.doc_id}")
        texts.append(p.title + " " + "".join(p.sentences))
    return ids, texts


def load_corpus(hotpot: Path, synthetic_docs: int | None, target: int) -> tuple[list[str], list[str], list[str]]:
    """(doc ids, texts, questions): the file's paragraphs, then generated ones up to `target` documents."""
    ids, texts, questions = hotpot_corpus(hotpot)
    n = max(0, target - len(texts)) if synthetic_docs is None else synthetic_docs
    if n:
        more_ids, more_texts = synthetic_texts(n)
        ids, texts = ids + more_ids, texts + more_texts
    return ids, texts, questions


def world_tokens(hotpot: Path, target: int, worlds: Path | None, chunk: int = 100_000):
    """(doc ids, token lists, analyze seconds) of the corpus of `target` documents (`load_corpus`'s), kept
    under `worlds/<target>` once analyzed (a vocabulary, each document's term ids), so that a large world
    is generated once. Every token list holds the vocabulary's own strings: one object per term."""
    from xh.retrieval.analyzer import Analyzer

    folder = worlds / str(target) if worlds else None
    if folder is None or not (folder / "tokens.npy").exists():
        ids, texts, _ = hotpot_corpus(hotpot)
        analyzer, vocab, codes, lengths = Analyzer(), {}, [], []
        start = time.perf_counter()
        pending = [(ids, texts)] + [
            (None, (a, min(a + chunk, target - len(texts)))) for a in range(0, max(0, target - len(texts)), chunk)
        ]
        all_ids = []
        for part_ids, part in pending:
            if part_ids is None:
                part_ids, part = synthetic_texts(target - len(texts), *part)
            for tokens in analyzer.analyze_batch(part):
                codes.append(np.fromiter((vocab.setdefault(t, len(vocab)) for t in tokens), np.int32, len(tokens)))
                lengths.append(len(tokens))
            all_ids += part_ids
        analyze_seconds = time.perf_counter() - start
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            np.save(folder / "lengths.npy", np.array(lengths, np.int64))
            (folder / "vocab.json").write_text(json.dumps(list(vocab)))
            (folder / "doc_ids.json").write_text(json.dumps(all_ids))
            (folder / "meta.json").write_text(json.dumps({"analyze_seconds": analyze_seconds}))
            np.save(folder / "tokens.npy", np.concatenate(codes))  # written last: the world is complete
        terms = list(vocab)
        return all_ids, [[terms[i] for i in c.tolist()] for c in codes], analyze_seconds
    terms = json.loads((folder / "vocab.json").read_text())
    flat, lengths = np.load(folder / "tokens.npy").tolist(), np.load(folder / "lengths.npy")
    ends = np.cumsum(lengths).tolist()
    tokens = [[terms[i] for i in flat[a:b]] for a, b in zip([0, *ends[:-1]], ends)]
    del flat
    meta = json.loads((folder / "meta.json").read_text())
    return json.loads((folder / "doc_ids.json").read_text()), tokens, meta["analyze_seconds"]


def best_of(repeat: int, fn):
    """(smallest wall time, last result) over `repeat` runs."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def agrees(positions: np.ndarray, scores: np.ndarray, reference: np.ndarray, k: int) -> bool:
    """Is (positions, scores) a top-k of the reference scores, up to ties within TOLERANCE?

    The project returns only documents sharing a term with the query (score > 0 here, since the
    corpus's average idf is positive), so the reference's top-k is taken among positive scores.
    """
    matched = np.flatnonzero(reference > 0)
    expected = np.sort(reference[matched])[::-1][:k]
    return (
        len(positions) == len(expected)
        and len(set(positions.tolist())) == len(positions)
        and bool(np.all(np.abs(scores - expected) <= TOLERANCE))
        and bool(np.all(np.abs(reference[positions] - scores) <= TOLERANCE))
    )


class PeakRSS:
    """Peak resident memory of this process above its level on entry, sampled every 5 ms (`.mib`)."""

    def __enter__(self):
        from procs import rss

        self._rss, self._start, self._peak, self._done = rss, rss(os.getpid()), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self._peak = max(self._peak, self._rss(os.getpid()))

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.mib = round(max(0, self._peak - self._start) / 2**20, 1)


def same_top(a_scores: np.ndarray, b_scores: np.ndarray, rel: float) -> bool:
    """The same top-k scores (each system's own order), within a relative tolerance (bm25s sums float32)."""
    return len(a_scores) == len(b_scores) and bool(np.all(np.abs(a_scores - b_scores) <= rel * np.abs(b_scores)))


def rank_bm25_check(tokens, queries, results, k: int) -> dict:
    """The project's top k against rank-bm25's scores of every document, ties aware (`agrees`), and in the
    project's tie order on rank-bm25's floats; rank-bm25's own rate (get_scores + argsort)."""
    from rank_bm25 import BM25Okapi

    reference = BM25Okapi(tokens)
    identical = strict = 0
    start = time.perf_counter()
    for q, result in zip(queries, results):
        scores = reference.get_scores(q)
        np.argsort(scores)[::-1][:k]
        identical += agrees(result.positions, result.scores, scores, k)
        matched = np.flatnonzero(scores > 0)
        expected = matched[np.lexsort((matched, -scores[matched]))][:k]  # the project's tie rule
        strict += np.array_equal(expected, result.positions)
    seconds = time.perf_counter() - start  # the checks' own cost is small beside get_scores
    return {"checked": len(queries), "identical": identical, "same_order": strict, "qps": len(queries) / seconds}


def measure_size(args, target: int) -> dict:
    """Every figure of one corpus size (see the module docstring)."""
    import bm25s  # benchmark-only dependency

    from xh.retrieval import bm25 as project
    from xh.retrieval.analyzer import Analyzer
    from xh.retrieval.bm25 import BM25Shard, CorpusStats

    doc_ids, tokens, analyze_seconds = world_tokens(args.hotpot, target, args.worlds)
    _, _, questions = hotpot_corpus(args.hotpot)
    analyzer, k = Analyzer(), args.k
    queries = analyzer.analyze_batch(questions)
    with PeakRSS() as build_memory:
        start = time.perf_counter()
        shard = BM25Shard.build(doc_ids, tokens, CorpusStats.from_token_lists(tokens), analyzer=analyzer)
        build_seconds = time.perf_counter() - start
    with PeakRSS() as peer_memory:
        start = time.perf_counter()
        peer = bm25s.BM25(method="robertson")  # the same token lists; "robertson" is its method closest to Okapi
        peer.index(tokens, show_progress=False)
        peer_build_seconds = time.perf_counter() - start
    peer_queries = [q if q else [""] for q in queries]  # bm25s wants a token in every query

    def peer_run(backend: str, threads: int, some=None):
        peer.backend = backend  # bm25s's backend is chosen at retrieval: one index serves both
        return peer.retrieve(some or peer_queries, k=k, show_progress=False, n_threads=threads)

    for threads in (1, 2):  # warm-ups: the JIT compiles (both backends' numba functions) here
        shard.search(queries[:50], k, threads=threads)
        peer_run("numba", threads, peer_queries[:50])
    numpy_queries = peer_queries[: args.bm25s_numpy_queries]
    timed = {}
    for run in range(args.runs):
        for name, fn in {
            "project": lambda: shard.search(queries, k),
            "bm25s_numba": lambda: peer_run("numba", 1),
            "project_2t": lambda: shard.search(queries, k, threads=2),
            "bm25s_numba_2t": lambda: peer_run("numba", 2),
        }.items():
            seconds, out = best_of(args.repeat, fn)
            timed.setdefault(name, []).append(len(queries) / seconds)
            if run == 0:
                timed[name + "_out"] = out
    numpy_seconds, _ = best_of(1, lambda: peer_run("numpy", 0, numpy_queries))
    project.USE_KERNEL = False  # the numpy path: what runs where numba is not installed
    fallback_seconds, fallback = best_of(1, lambda: shard.search(queries, k))
    project.USE_KERNEL = True
    ours, numba_hits = timed["project_out"], timed["bm25s_numba_out"]
    scale = shard.params.k1 + 1
    checks = {
        "numpy_path_identical": all(
            a.doc_ids == b.doc_ids and np.array_equal(a.scores, b.scores) for a, b in zip(ours, fallback)
        ),
        "threads_identical": all(
            a.doc_ids == b.doc_ids and np.array_equal(a.scores, b.scores) for a, b in zip(ours, timed["project_2t_out"])
        ),
        # bm25s leaves out BM25's constant factor (k1 + 1): its scores times that are the project's
        "bm25s_same_top10": sum(
            same_top(r.scores, scale * numba_hits.scores[q][: len(r)], 1e-5) for q, r in enumerate(ours) if len(r)
        ),
        "bm25s_compared": sum(1 for r in ours if len(r)),
    }
    if target <= args.rank_bm25_max_docs:
        some = args.rank_bm25_queries
        checks["rank_bm25"] = rank_bm25_check(tokens, queries[:some], ours[:some], k)
    return {
        "docs": len(doc_ids),
        "queries": len(queries),
        "postings": int(shard.weights.nnz),
        **{name: spread(values, 1) for name, values in timed.items() if not name.endswith("_out")},
        "ratio_vs_bm25s_numba": spread([a / b for a, b in zip(timed["project"], timed["bm25s_numba"])], 2),
        "ratio_vs_bm25s_numba_2t": spread([a / b for a, b in zip(timed["project_2t"], timed["bm25s_numba_2t"])], 2),
        "bm25s_numpy": round(len(numpy_queries) / numpy_seconds, 1),
        "project_numpy_path": round(len(queries) / fallback_seconds, 1),
        "build_seconds": round(build_seconds, 2),
        "build_peak_mib": build_memory.mib,
        "bm25s_build_seconds": round(peer_build_seconds, 2),
        "bm25s_build_peak_mib": peer_memory.mib,
        "analyze_seconds": round(analyze_seconds, 1),
        "memory_bytes_per_doc": round(shard.memory_bytes() / len(doc_ids), 1),
        "checks": checks,
    }


def spread(values: list[float], digits: int) -> dict:
    return {"min": round(min(values), digits), "median": round(statistics.median(values), digits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hotpot", type=Path, required=True, help="HotpotQA-format JSON (paragraphs and questions)")
    parser.add_argument("--docs", type=int, nargs="+", default=[20_000], help="corpus sizes (documents)")
    parser.add_argument("--worlds", type=Path, default=None, help="folder keeping each size's analyzed corpus")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--rank-bm25-queries", type=int, default=50, help="queries checked against rank-bm25")
    parser.add_argument("--rank-bm25-max-docs", type=int, default=1_000_000, help="no rank-bm25 above (memory)")
    parser.add_argument("--bm25s-numpy-queries", type=int, default=100, help="queries timed on bm25s numpy")
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats per run (best kept)")
    parser.add_argument("--runs", type=int, default=3, help="whole measurements of every system, in one process")
    args = parser.parse_args()
    import bm25s

    print(json.dumps({"bm25s": bm25s.__version__, "numba": importlib.metadata.version("numba"),
                      "python": platform.python_version(), "load_average": os.getloadavg()}), flush=True)  # fmt: skip
    for target in args.docs:
        figures = measure_size(args, target)
        print(json.dumps({**figures, "load_average": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
