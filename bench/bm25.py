"""Benchmark: the project's exact BM25 against bm25s (the fast peer) and rank-bm25 (the reference), same run.

    .venv/bin/python bench/bm25.py --hotpot ../shared/data/hotpotqa/hotpot_train_sample500.json
    .venv/bin/python bench/bm25.py --hotpot FILE --docs 20000 1000000 5230000 --worlds DIR --runs 2 --repeat 1

Per size N in `--docs`: the context paragraphs of a HotpotQA-format file (one document per title) and
generated pages of `xh.synth` (seed 13, the generator of `bench/scale.py`'s worlds) up to N documents,
analyzed once and kept under `--worlds/<N>` (a large world takes minutes to generate); the queries: the
file's questions. Every system gets the same token lists from `xh.retrieval.analyzer`. One JSON line per
size (after a first line of versions and the load average):

    project, project_2t            queries/s of `BM25Shard.search` (top k, one batched call), 1 and 2 threads
                                   (the compiled scorer where numba is installed): a result object per query
    project_arrays(_2t)            queries/s of `BM25Shard.top_k`: the same top k as arrays, as bm25s returns
                                   them (no Python object per query)
    bm25s_numba, bm25s_numba_2t    `bm25s.BM25.retrieve` with its numba backend, 1 and 2 threads (n_threads)
    ratio_vs_bm25s_numba(_2t)      project / bm25s numba in the same run (per run, then min and median);
                                   arrays_ratio_vs_bm25s_numba(_2t): project_arrays / bm25s numba
    cpu_qps, cpu_(arrays_)ratio_vs_bm25s_numba
                                   the one-thread rates and ratios over this process's processor time instead
                                   of wall time (on a loaded machine, waiting for a core moves wall time most)
    bm25s_numpy                    bm25s's default numpy backend, on the first `--bm25s-numpy-queries`
    project_numpy_path             the project without the compiled scorer (its numpy path)
    build_seconds, build_peak_mib  `CorpusStats` + `BM25Shard.build` from token lists, and the peak resident
                                   memory above the level before it (sampled every 5 ms); bm25s_build_*: its
                                   `index` on the same tokens
    memory_bytes_per_doc           the searchable shard's arrays in memory
    search_memory                  what a batched search holds above the shard (`search_memory`); over
                                   several sizes, the growth exponent of its traced peak (0: flat)
    checks                         numpy_path_identical, threads_identical, arrays_identical: the same
                                   documents and floats;
                                   bm25s_same_top10: queries whose top k scores are bm25s's times (k1 + 1)
                                   (bm25s leaves that constant out; it sums float32, so within 1e-5
                                   relative), of bm25s_compared; bm25s_differs_with_negative_idf: the
                                   others whose query has a term in more than half the documents
                                   (bm25s's idf 0 there, rank-bm25's a positive floor); rank_bm25 (up to `--rank-bm25-max-docs`,
                                   its memory grows with N): on the first `--rank-bm25-queries`, the top k
                                   equal to rank-bm25's ties aware (`agrees`), in the project's tie order on
                                   rank-bm25's floats (same_order), and rank-bm25's rate

Each size measures every system `--runs` times, interleaved, each the best of `--repeat`; throughputs
are reported as min and median over the runs. JIT compiles are left to warm-ups. bm25s and numba are
benchmark-only dependencies (the `bench` extra); rank-bm25 is a test dependency.
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
    """(smallest wall time, smallest processor time of this process, last result) over `repeat` runs."""
    best, best_cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        best, best_cpu = min(best, time.perf_counter() - start), min(best_cpu, time.process_time() - start_cpu)
    return best, best_cpu, result


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
        shard.top_k(queries[:50], k, threads=threads)
        peer_run("numba", threads, peer_queries[:50])
    searching_memory = search_memory(shard, queries, k)  # before the numpy path builds its dense rows
    numpy_queries = peer_queries[: args.bm25s_numpy_queries]
    timed, cpu = {}, {}
    for run in range(args.runs):
        for name, fn in {
            "project": lambda: shard.search(queries, k),
            "project_arrays": lambda: shard.top_k(queries, k),
            "bm25s_numba": lambda: peer_run("numba", 1),
            "project_2t": lambda: shard.search(queries, k, threads=2),
            "project_arrays_2t": lambda: shard.top_k(queries, k, threads=2),
            "bm25s_numba_2t": lambda: peer_run("numba", 2),
        }.items():
            seconds, cpu_seconds, out = best_of(args.repeat, fn)
            timed.setdefault(name, []).append(len(queries) / seconds)
            if not name.endswith("_2t"):  # one thread: its processor time is a rate that other work moves less
                cpu.setdefault(name, []).append(len(queries) / cpu_seconds)
            if run == 0:
                timed[name + "_out"] = out
    numpy_seconds, _, _ = best_of(1, lambda: peer_run("numpy", 0, numpy_queries))
    project.USE_KERNEL = False  # the numpy path: what runs where numba is not installed
    fallback_seconds, _, fallback = best_of(1, lambda: shard.search(queries, k))
    project.USE_KERNEL = True
    ours = timed["project_out"]
    checks = same_results(shard, timed, fallback, queries)
    if target <= args.rank_bm25_max_docs:
        some = args.rank_bm25_queries
        checks["rank_bm25"] = rank_bm25_check(tokens, queries[:some], ours[:some], k)
    return {
        "docs": len(doc_ids),
        "queries": len(queries),
        "postings": int(shard.weights.nnz),
        **{name: spread(values, 1) for name, values in timed.items() if not name.endswith("_out")},
        **ratios(timed, cpu),
        "bm25s_numpy": round(len(numpy_queries) / numpy_seconds, 1),
        "project_numpy_path": round(len(queries) / fallback_seconds, 1),
        "build_seconds": round(build_seconds, 2),
        "build_peak_mib": build_memory.mib,
        "bm25s_build_seconds": round(peer_build_seconds, 2),
        "bm25s_build_peak_mib": peer_memory.mib,
        "analyze_seconds": round(analyze_seconds, 1),
        "memory_bytes_per_doc": round(shard.memory_bytes() / len(doc_ids), 1),
        "search_memory": searching_memory,
        "checks": checks,
    }


def search_memory(shard, queries, k: int) -> dict:
    """What searching itself holds, above the shard: the peak of Python's traced allocations (numpy's
    arrays included; not the compiled scorer's few window-sized arrays) during one batched `search` and
    one `top_k`, results included, and the peak resident memory above the level before (sampled)."""
    import tracemalloc

    figures = {}
    for name, fn in {"search": lambda: shard.search(queries, k), "top_k": lambda: shard.top_k(queries, k)}.items():
        with PeakRSS() as resident:
            fn()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        figures[name + "_traced_peak_mib"] = round((tracemalloc.get_traced_memory()[1] - base) / 2**20, 2)
        tracemalloc.stop()
        figures[name + "_rss_peak_mib"] = resident.mib
    return figures


def same_results(shard, timed: dict, fallback, queries) -> dict:
    """The exactness checks of one size (see the module docstring's `checks`)."""
    ours, numba_hits, arrays = timed["project_out"], timed["bm25s_numba_out"], timed["project_arrays_out"]
    scale = shard.params.k1 + 1
    return {
        "numpy_path_identical": all(
            a.doc_ids == b.doc_ids and np.array_equal(a.scores, b.scores) for a, b in zip(ours, fallback)
        ),
        "arrays_identical": all(
            arrays.positions[q, : len(r)].tolist() == r.positions.tolist()
            and np.array_equal(arrays.scores[q, : len(r)], r.scores)
            and arrays.counts[q] == len(r)
            for q, r in enumerate(ours)
        ),
        "threads_identical": all(
            a.doc_ids == b.doc_ids and np.array_equal(a.scores, b.scores) for a, b in zip(ours, timed["project_2t_out"])
        ),
        # bm25s leaves out BM25's constant factor (k1 + 1): its scores times that are the project's
        "bm25s_same_top10": sum(
            same_top(r.scores, scale * numba_hits.scores[q][: len(r)], 1e-5) for q, r in enumerate(ours) if len(r)
        ),
        "bm25s_compared": sum(1 for r in ours if len(r)),
        # bm25s's "robertson" idf is 0 for a term in more than half the documents, rank-bm25's a small
        # positive floor (epsilon x the average idf): those queries' scores differ by definition
        "bm25s_differs_with_negative_idf": sum(
            not same_top(r.scores, scale * numba_hits.scores[q][: len(r)], 1e-5)
            and any(
                shard.term_dfs[shard.term_rows[t]] * 2 > shard.stats["num_docs"]
                for t in queries[q]
                if t in shard.term_rows
            )
            for q, r in enumerate(ours)
            if len(r)
        ),
    }


def ratios(timed: dict, cpu: dict) -> dict:
    """The project's rates over bm25s numba's, run by run (then min and median): wall and processor time."""

    def ratio(ours: list[float], theirs: list[float]) -> dict:
        return spread([a / b for a, b in zip(ours, theirs)], 2)

    return {
        "ratio_vs_bm25s_numba": ratio(timed["project"], timed["bm25s_numba"]),
        "ratio_vs_bm25s_numba_2t": ratio(timed["project_2t"], timed["bm25s_numba_2t"]),
        "arrays_ratio_vs_bm25s_numba": ratio(timed["project_arrays"], timed["bm25s_numba"]),
        "arrays_ratio_vs_bm25s_numba_2t": ratio(timed["project_arrays_2t"], timed["bm25s_numba_2t"]),
        "cpu_qps": {name: spread(values, 1) for name, values in cpu.items()},
        "cpu_ratio_vs_bm25s_numba": ratio(cpu["project"], cpu["bm25s_numba"]),
        "cpu_arrays_ratio_vs_bm25s_numba": ratio(cpu["project_arrays"], cpu["bm25s_numba"]),
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
    sizes, traced = [], []
    for target in args.docs:
        figures = measure_size(args, target)
        print(json.dumps({**figures, "load_average": [round(x, 2) for x in os.getloadavg()]}), flush=True)
        sizes.append(figures["docs"])
        traced.append(figures["search_memory"]["search_traced_peak_mib"])
    if len(sizes) > 1:  # least-squares slope of log memory against log N: 0 is flat
        slope = np.polyfit(np.log(sizes), np.log(traced), 1)[0]
        print(json.dumps({"search_traced_peak_growth_exponent": round(float(slope), 3), "docs": sizes}), flush=True)


if __name__ == "__main__":
    main()
