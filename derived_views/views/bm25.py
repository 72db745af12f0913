"""Okapi BM25 relevance and the tokenizer shared by indexing and querying (pure Python).

``score(D, Q) = sum over query terms q of idf(q) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * |D| / avgdl))``
with ``idf(q) = ln(1 + (N - n(q) + 0.5) / (n(q) + 0.5))`` (always positive), ``N`` documents, ``n(q)``
of them holding ``q``, ``|D|`` the document's length in tokens and ``avgdl`` the mean length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

K1 = 1.2
B = 0.75

#: A token is a run of letters and digits (Spark side: ``[^\\p{L}\\p{N}]+`` splits, see the search view).
_TOKEN = re.compile(r"[^\W_]+")

#: The same split as a Java regular expression, for Spark's ``split``.
SPARK_SPLIT = r"[^\p{L}\p{N}]+"


def tokenize(text: str | None) -> list[str]:
    """Lower-case tokens of ``text``, in order."""
    return _TOKEN.findall(text.lower()) if text else []


def idf(n_docs: int, doc_freq: int) -> float:
    """Inverse document frequency of a term held by ``doc_freq`` of ``n_docs`` documents."""
    return math.log(1.0 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))


def term_score(tf: int, doc_freq: int, n_docs: int, doc_len: int, avg_len: float, k1: float = K1, b: float = B) -> float:
    """BM25 contribution of one query term to one document."""
    if tf <= 0 or n_docs <= 0:
        return 0.0
    norm = 1.0 - b + b * (doc_len / avg_len if avg_len > 0 else 0.0)
    return idf(n_docs, doc_freq) * tf * (k1 + 1.0) / (tf + k1 * norm)


@dataclass(frozen=True)
class Posting:
    """One term occurrence row of the terms table: a document id, the term, its count, the doc length."""

    doc_id: str
    """The document's key (its ``_cdc_key``)."""
    term: str
    tf: int
    doc_len: int


def rank(postings: Iterable[Posting], n_docs: int, avg_len: float, limit: int) -> list[tuple[str, float]]:
    """``(doc_id, score)`` of the best ``limit`` documents, best first (ties by id)."""
    rows = list(postings)
    doc_freq: dict[str, int] = {}
    for posting in rows:
        doc_freq[posting.term] = doc_freq.get(posting.term, 0) + 1
    scores: dict[str, float] = {}
    for posting in rows:
        scores[posting.doc_id] = scores.get(posting.doc_id, 0.0) + term_score(
            posting.tf, doc_freq[posting.term], n_docs, posting.doc_len, avg_len
        )
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]
