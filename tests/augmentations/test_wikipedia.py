"""Offline Wikipedia retrieval over the real shipped corpus."""

from __future__ import annotations

import pytest

from augmentations.base import CallContext
from augmentations.wikipedia import Article, BM25Index, Wikipedia, first_sentences


@pytest.fixture(scope="module")
def wiki() -> Wikipedia:
    return Wikipedia(max_chars=300)


async def test_exact_title(wiki: Wikipedia) -> None:
    r = await wiki.run("Alan Turing", CallContext())
    assert not r.error and r.content.startswith("Alan Turing: Alan Mathison Turing was an English mathematician")
    assert len(r.content) <= len("Alan Turing: ") + 300 + 3


@pytest.mark.parametrize(
    "query, title",
    [
        ("Everest height", "Mount Everest"),
        ("lattice tower Champ de Mars Paris", "Eiffel Tower"),
        ("Einstein", "Albert Einstein"),
        ("who was Marie Curie", "Marie Curie"),
    ],
)
async def test_bm25_finds_the_article(wiki: Wikipedia, query: str, title: str) -> None:
    r = await wiki.run(query, CallContext())
    assert r.content.startswith(title + ":"), r.content[:80]


async def test_no_match_and_empty(wiki: Wikipedia) -> None:
    assert (await wiki.run("qwzxv plmokn", CallContext())).content.startswith("No article matches")
    assert (await wiki.run("  ", CallContext())).error


def test_bm25_ranks_by_relevance() -> None:
    idx = BM25Index([
        Article("Cats", "Cats are small furry animals that purr."),
        Article("Dogs", "Dogs bark. Dogs are loyal animals."),
        Article("Cars", "Cars have wheels and engines."),
    ])
    assert [a.title for _, a in idx.search("loyal dogs that bark", 2)][0] == "Dogs"
    assert idx.search("cars")[0][0] == float("inf")  # exact title
    assert first_sentences("One. Two. Three.", 9) == "One. Two."
