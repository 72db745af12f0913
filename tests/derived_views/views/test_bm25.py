"""BM25 relevance for the search indexes: tokens, term scores and ranking, without Spark."""

from __future__ import annotations

import math

import pytest

from derived_views.views.bm25 import Posting, idf, rank, term_score, tokenize


def test_tokenize_splits_on_non_alphanumerics() -> None:
    assert tokenize("Desk-Lamp, 60W (brass)_x") == ["desk", "lamp", "60w", "brass", "x"]
    assert tokenize(None) == []


def test_bm25_prefers_rare_terms_and_shorter_documents() -> None:
    assert idf(100, 1) > idf(100, 50) > 0
    assert term_score(1, 5, 100, 10, 20.0) > term_score(1, 5, 100, 40, 20.0)
    assert term_score(3, 5, 100, 20, 20.0) > term_score(1, 5, 100, 20, 20.0)
    expected = math.log(1 + (10 - 1 + 0.5) / 1.5) * 2.2 / (1 + 1.2)
    assert term_score(1, 1, 10, 20, 20.0) == pytest.approx(expected)


def test_rank_sums_terms_and_orders_best_first() -> None:
    postings = [Posting(1, "lamp", 1, 10), Posting(2, "lamp", 1, 10), Posting(2, "brass", 1, 10)]
    ranked = rank(postings, n_docs=10, avg_len=10.0, limit=5)
    assert [doc for doc, _ in ranked] == [2, 1]
    assert rank(postings, 10, 10.0, limit=1)[0][0] == 2
