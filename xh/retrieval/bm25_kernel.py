"""Exact top-k BM25 of a batch of queries, compiled with numba: document at a time, MaxScore pruning.

`xh.retrieval.bm25` uses it when numba imports (it is optional: without it the numpy path scores the same
floats, slower). The weights are the shard's CSR rows (one per term, documents ascending); each term's
largest weight (`term_max`) bounds what it can add to a document.

Per query, the terms' posting lists are walked together in document order (each list keeps a cursor).
The best k so far sit in a heap; once it is full, its worst score is the threshold a document must beat.
The terms, sorted by their bound (largest weight x count), split in two: the first ones, whose bounds
together cannot beat the threshold, are "non-essential": a document found in none of the others cannot
enter, so only the essential lists propose documents, and a proposed document looks the non-essential
ones up (a forward search in their lists) only while its best possible score could still beat the
threshold (MaxScore, Turtle and Flood 1995). Where a window's postings of the non-essential lists are
few beside its candidates (dense lists in a small shard), they are added up into a second array instead
(`_add_rest`): a candidate's bound is then its two sums, with no search. Documents arrive in ascending order, so a document tying
the threshold never enters (ties go to the earlier document): the order of `bm25._top_k`.

Exactness: a document that passes is scored by adding its terms' weights in the query's term order (the
order the numpy path adds in), so the scores are the numpy path's floats, bit for bit. The bounds are
compared with a relative margin (`MARGIN`) far above the rounding of a sum, so no document that could
enter is ever skipped. Every weight must be positive (the caller checks).

No array here spans the shard: the working memory of a query is a few arrays of its own terms and k.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Relative slack on every pruning bound: a bound is a sum of up to a few thousand terms in another order
# than the score's, off by at most ~1e-13 relative; this is far above that and prunes as well.
MARGIN = 1e-9
NO_DOC = np.iinfo(np.int64).max
# Documents scored together: one window's running sums stay in the processor's fast cache.
WINDOW = 4096
# A window's postings of the lists not walked are added up rather than searched per candidate when there
# are at most this many per candidate (a search in a dense list costs some tens of additions).
REST_POSTINGS = 16


@njit(cache=True, nogil=True, inline="always")
def _worse(s1, d1, s2, d2):
    """Is (s1, d1) ranked after (s2, d2)? Score descending, then document ascending."""
    return s1 < s2 or (s1 == s2 and d1 > d2)


@njit(cache=True, nogil=True)
def _sift_down(hs, hd, n, i):
    """Restore the heap below i: the worst entry at the root."""
    while True:
        left, worst = 2 * i + 1, i
        if left < n and _worse(hs[left], hd[left], hs[worst], hd[worst]):
            worst = left
        if left + 1 < n and _worse(hs[left + 1], hd[left + 1], hs[worst], hd[worst]):
            worst = left + 1
        if worst == i:
            return
        hs[i], hs[worst] = hs[worst], hs[i]
        hd[i], hd[worst] = hd[worst], hd[i]
        i = worst


@njit(cache=True, nogil=True)
def _push(hs, hd, n, score, doc):
    """Add an entry to a heap of n entries (room assumed); returns the new size."""
    i = n
    hs[i], hd[i] = score, doc
    while i > 0:
        parent = (i - 1) // 2
        if not _worse(hs[i], hd[i], hs[parent], hd[parent]):
            break
        hs[i], hs[parent] = hs[parent], hs[i]
        hd[i], hd[parent] = hd[parent], hd[i]
        i = parent
    return n + 1


@njit(cache=True, nogil=True)
def _seek(indices, lo, hi, doc):
    """First position in indices[lo:hi] (ascending) holding doc or more: galloping, then bisection."""
    if lo >= hi or indices[lo] >= doc:  # the common case of a cursor moving forward a little
        return lo
    step = 1
    while lo + step < hi and indices[lo + step] < doc:
        lo += step
        step *= 2
    top = min(lo + step, hi)
    while lo < top:
        mid = (lo + top) // 2
        if indices[mid] < doc:
            lo = mid + 1
        else:
            top = mid
    return lo


@njit(cache=True, nogil=True)
def _score(indices, weights, lo, stop, counts, doc):
    """A document's exact score: its terms' weights added in the query's term order (a search per list
    from the window's start)."""
    score = 0.0
    for j in range(len(counts)):
        p = _seek(indices, lo[j], stop[j], doc)
        if p < stop[j] and indices[p] == doc:
            score += counts[j] * weights[p]
    return score


@njit(cache=True, nogil=True)
def _may_enter(indices, weights, counts, order, prefix, lo, stop, essential, partial, doc, theta):
    """Can a document whose walked lists add `partial` beat the threshold? The lists not walked are
    looked up largest bound first, each bound replaced by what the list adds, until the best the
    document can still reach falls below the threshold (no) or every list is read (yes)."""
    for r in range(essential - 1, -1, -1):
        if partial * (1.0 + MARGIN) + prefix[r] < theta:
            return False
        j = order[r]
        p = _seek(indices, lo[j], stop[j], doc)
        if p < stop[j] and indices[p] == doc:
            partial += counts[j] * weights[p]
    return partial * (1.0 + MARGIN) >= theta


@njit(cache=True, nogil=True)
def _scatter(indices, weights, counts, cur, stop, lo, essential_flag, start, acc, touched):
    """Add the window's postings of the essential lists into `acc` in the query's term order (the lists
    not walked only move their cursor to the window: `lo`); returns how many documents were touched,
    listed in `touched`."""
    found = 0
    for j in range(len(counts)):
        if not essential_flag[j]:
            cur[j] = lo[j] = _seek(indices, cur[j], stop[j], start)
            continue
        lo[j] = p = cur[j]
        last, count = stop[j], counts[j]  # locals: the stores below could alias the arrays for the compiler
        while p < last:
            d = indices[p] - start
            if d >= WINDOW:
                break
            touched[found] = d
            found += acc[d] == 0.0  # weights are positive: a first visit (counted without a branch)
            acc[d] += count * weights[p]
            p += 1
        cur[j] = p
    return found


@njit(cache=True, nogil=True)
def _one_query(indptr, indices, weights, term_max, terms, counts, k, out_docs, out_scores, work, acc, touched):
    """The top k of one query (its distinct term rows in adding order, their counts) into out_*;
    returns how many. `work` holds scratch arrays sized for the batch's longest query, `acc` and
    `touched` a window's (zeros in `acc` between calls)."""
    m = len(terms)
    cur, stop, lo, bound, order, prefix, essential_flag, hi, rest = work
    for j in range(m):
        cur[j], stop[j] = indptr[terms[j]], indptr[terms[j] + 1]
        bound[j] = counts[j] * term_max[terms[j]]
        essential_flag[j] = True
    _order_by(bound, order, m)  # ascending bound: the non-essential terms are a prefix
    total = 0.0
    for r in range(m):
        total += bound[order[r]]
        prefix[r] = total * (1.0 + MARGIN)  # bound of a document holding terms order[0..r] only
    hs, hd = out_scores, out_docs
    n, essential, theta = 0, 0, -1.0
    while True:
        start = NO_DOC  # the window starts at the next document of an essential list
        for j in range(m):
            if essential_flag[j] and cur[j] < stop[j] and indices[cur[j]] < start:
                start = indices[cur[j]]
        if start == NO_DOC:
            break
        scattered_all = essential == 0  # then `acc` holds exact scores
        found = _scatter(indices, weights, counts, cur, stop, lo, essential_flag, start, acc, touched)
        added = not scattered_all and _add_rest(
            indices, weights, counts, lo, hi, stop, essential_flag, start, rest, found
        )
        for i in range(found):
            d = touched[i]
            score, doc = acc[d], start + d
            acc[d] = 0.0
            if not scattered_all:
                if n == k and added:
                    if (score + rest[d]) * (1.0 + MARGIN) < theta:
                        continue
                elif n == k and not _may_enter(
                    indices, weights, counts, order, prefix, lo, stop, essential, score, doc, theta
                ):
                    continue
                score = _score(indices, weights, lo[:m], stop[:m], counts, doc)
            if n < k:
                n = _push(hs, hd, n, score, doc)
            elif _worse(hs[0], hd[0], score, doc):
                hs[0], hd[0] = score, doc
                _sift_down(hs, hd, n, 0)
            else:
                continue
            if n == k:
                theta, essential = _raise(hs[0], prefix, order, essential_flag, essential, m)
        if added:
            _clear_rest(indices, lo, hi, start, rest, m)
    for last in range(n - 1, 0, -1):  # heap -> best first: pop the worst to the end, repeatedly
        hs[0], hs[last] = hs[last], hs[0]
        hd[0], hd[last] = hd[last], hd[0]
        _sift_down(hs, hd, last, 0)
    return n


@njit(cache=True, nogil=True)
def _add_rest(indices, weights, counts, lo, hi, stop, essential_flag, start, rest, found):
    """Where the window's postings of the lists not walked are few beside its `found` candidates (a
    posting added costs a small part of a search), add them into `rest` (another order than the score's:
    a bound, not a score) and return True; else False, and the candidates search those lists."""
    total = 0
    for j in range(len(counts)):  # hi[j] > lo[j] only for the lists added (what `_clear_rest` clears)
        hi[j] = _seek(indices, lo[j], stop[j], start + WINDOW) if not essential_flag[j] else lo[j]
        total += hi[j] - lo[j]
    if total > REST_POSTINGS * found:
        return False
    for j in range(len(counts)):
        if not essential_flag[j]:
            count = counts[j]
            for p in range(lo[j], hi[j]):
                rest[indices[p] - start] += count * weights[p]
    return True


@njit(cache=True, nogil=True)
def _clear_rest(indices, lo, hi, start, rest, m):
    """Zeros back in `rest` where `_add_rest` added (the lists not walked at the window's start)."""
    for j in range(m):
        for p in range(lo[j], hi[j]):
            rest[indices[p] - start] = 0.0


@njit(cache=True, nogil=True)
def _raise(theta, prefix, order, essential_flag, essential, m):
    """A new threshold (a score k documents reach) and the lists it makes non-essential: those whose
    bounds together cannot reach it. Returns (threshold, number of non-essential lists)."""
    while essential < m and prefix[essential] < theta:
        essential_flag[order[essential]] = False
        essential += 1
    return theta, essential


@njit(cache=True, nogil=True)
def _order_by(values, order, m):
    """order[:m] = the indices of values[:m] by ascending value (insertion sort: m is a query's terms)."""
    for i in range(m):
        j = i
        while j > 0 and values[order[j - 1]] > values[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i


@njit(cache=True, nogil=True)
def _query_terms(token_rows, slot, keys, terms, counts):
    """A query's distinct known term rows in the order every path adds their weights (the terms that
    are not frequent, then the frequent ones, each by row) into `terms`, each one's number of tokens
    into `counts`; returns how many. Rows below 0 are tokens the shard does not know."""
    num_terms, n = len(slot), 0
    for t in token_rows:
        if t >= 0:
            keys[n] = t + num_terms if slot[t] >= 0 else t
            n += 1
    keys[:n].sort()
    m = 0
    for i in range(n):
        if m and keys[i] == keys[i - 1]:
            counts[m - 1] += 1.0
            continue
        terms[m], counts[m] = keys[i] % num_terms, 1.0
        m += 1
    return m


@njit(cache=True, nogil=True)
def search_batch(
    indptr, indices, weights, term_max, slot, token_ptr, token_rows, k, long_query, out_docs, out_scores, out_n
):
    """Query q's tokens are token_rows[token_ptr[q]:token_ptr[q + 1]] (term rows, below 0 where the shard
    does not know the token; `slot[row]` is 0 or more where the term is frequent: its weights are added
    after the others');
    its top k goes to out_docs[q], out_scores[q] (best first), and how many to out_n[q], or -1 for a query
    of more than `long_query` distinct terms (left to the caller). No Python runs per query; releases
    the GIL: threads may run parts of a batch at once."""
    longest = 1
    for q in range(len(token_ptr) - 1):
        longest = max(longest, token_ptr[q + 1] - token_ptr[q])
    keys, terms, counts = np.empty(longest, np.int64), np.empty(longest, np.int64), np.empty(longest, np.float64)
    most = min(longest, long_query)
    work = (
        np.empty(most, np.int64),
        np.empty(most, np.int64),
        np.empty(most, np.int64),
        np.empty(most, np.float64),
        np.empty(most, np.int64),
        np.empty(most, np.float64),
        np.empty(most, np.bool_),
        np.empty(most, np.int64),
        np.zeros(WINDOW, np.float64),
    )
    acc, touched = np.zeros(WINDOW, np.float64), np.empty(WINDOW, np.int64)
    for q in range(len(token_ptr) - 1):
        m = _query_terms(token_rows[token_ptr[q] : token_ptr[q + 1]], slot, keys, terms, counts)
        if m > long_query:
            out_n[q] = -1
        elif m == 0:
            out_n[q] = 0
        else:
            out_n[q] = _one_query(
                indptr, indices, weights, term_max, terms[:m], counts[:m], k, out_docs[q], out_scores[q],
                work, acc, touched,
            )  # fmt: skip
