"""Online Wikipedia through `wikipedia-api`'s own request and parsing code, against a MediaWiki API
stand-in on loopback (aiohttp); `auto` falls back to the offline index when that server is down.
Nothing here reaches the internet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from augmentations.base import CallContext, ToolError
from augmentations.wikipedia import Wikipedia

TURING = ("Alan Mathison Turing was an English mathematician and computer scientist. He formalised the "
          "concepts of algorithm and computation with the Turing machine.")
ARTICLES = {
    # Wiki-markup sections after the lead, as the API's explaintext + exsectionformat=wiki returns them:
    # the package splits them off, so the summary is the lead alone.
    "Alan Turing": (1, TURING + "\n\n== Early life ==\nTuring was born in Maida Vale, London."),
    "Lake Baikal": (2, "Lake Baikal is a rift lake in Siberia. It is the deepest lake in the world."),
}
REDIRECTS = {"Turing": "Alan Turing"}


@dataclass
class FakeWiki:
    """Answers the MediaWiki API calls wikipedia-api makes (action=query with prop=extracts, list=search)."""

    requests: list[dict[str, str]] = field(default_factory=list)
    user_agents: list[str] = field(default_factory=list)

    async def api(self, request: web.Request) -> web.Response:
        q = dict(request.query)
        self.requests.append(q)
        self.user_agents.append(request.headers.get("User-Agent", ""))
        if q.get("action") != "query" or q.get("format") != "json":
            return web.json_response({"error": {"code": "badvalue", "info": str(q)}})
        if q.get("list") == "search":
            words = set(q["srsearch"].lower().split())
            hits = [{"ns": 0, "title": t, "pageid": pid, "size": len(text), "wordcount": len(text.split()),
                     "snippet": text[:40], "timestamp": "2026-01-01T00:00:00Z"}
                    for t, (pid, text) in ARTICLES.items() if words & set(text.lower().replace(".", "").split())]
            limit = int(q.get("srlimit", 10))
            return web.json_response({"batchcomplete": "", "query": {
                "searchinfo": {"totalhits": len(hits)}, "search": hits[:limit]}})
        if q.get("prop") == "extracts":
            title = q["titles"]
            query: dict[str, Any] = {}
            if q.get("redirects") == "1" and title in REDIRECTS:
                query["redirects"] = [{"from": title, "to": REDIRECTS[title]}]
                title = REDIRECTS[title]
            if title in ARTICLES:
                pid, text = ARTICLES[title]
                query["pages"] = {str(pid): {"pageid": pid, "ns": 0, "title": title, "extract": text}}
            else:
                query["pages"] = {"-1": {"ns": 0, "title": title, "missing": ""}}
            return web.json_response({"batchcomplete": "", "query": query})
        return web.json_response({"error": {"code": "unsupported", "info": str(q)}})


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeWiki, str]]:
    fake = FakeWiki()
    app = web.Application()
    app.router.add_get("/w/api.php", fake.api)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    try:
        yield fake, str(srv.make_url("/w/api.php"))
    finally:
        await srv.close()


async def test_online_uses_the_packages_requests_and_parsing(server: tuple[FakeWiki, str]) -> None:
    fake, url = server
    wiki = Wikipedia(source="online", api_url=url, max_chars=300, user_agent="infercept-tests (loopback)")
    r = await wiki.run("Alan Turing", CallContext())
    assert r.content == f"Alan Turing: {TURING}"  # the lead only: the section after it was split off
    first = fake.requests[0]
    assert first["action"] == "query" and first["prop"] == "extracts" and first["titles"] == "Alan Turing"
    assert (first["format"], first["redirects"], first["explaintext"], first["exsectionformat"]) == (
        "json", "1", "1", "wiki")
    assert fake.user_agents[0].startswith("infercept-tests (loopback) Wikipedia-API/0.16")
    # A redirect is followed by the API and reported under the target's title.
    assert (await wiki.run("Turing", CallContext())).content == f"Alan Turing: {TURING}"
    # No page of that title: the package's full-text search (list=search), then that page's lead.
    n = len(fake.requests)
    r = await wiki.run("deepest lake", CallContext())
    assert r.content == f"Lake Baikal: {ARTICLES['Lake Baikal'][1]}"
    assert [q.get("prop") or q.get("list") for q in fake.requests[n:]] == ["extracts", "search", "extracts"]
    assert fake.requests[n + 1]["srsearch"] == "deepest lake" and fake.requests[n + 1]["srlimit"] == "1"
    assert (await wiki.run("qwzxv", CallContext())).content == "No article matches 'qwzxv'."
    await wiki.close()


async def test_auto_answers_online_when_it_can_and_online_errors_are_tool_errors(server: tuple[FakeWiki, str]) -> None:
    fake, url = server
    auto = Wikipedia(source="auto", api_url=url, max_chars=200)
    assert (await auto.run("Lake Baikal", CallContext())).content == f"Lake Baikal: {ARTICLES['Lake Baikal'][1]}"
    await auto.close()
    down = url.replace("/w/api.php", "/nowhere")  # the server answers 404 here: an HTTP error
    online = Wikipedia(source="online", api_url=down)
    with pytest.raises(ToolError, match="Wikipedia is unreachable: WikiHttpError"):
        await online.run("Alan Turing", CallContext())
    await online.close()


async def test_auto_falls_back_to_the_offline_index_when_the_server_is_down() -> None:
    # A port on loopback with nothing listening: connection refused, at once.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wiki = Wikipedia(source="auto", api_url=f"http://127.0.0.1:{port}/w/api.php", max_chars=120)
    r = await wiki.run("Alan Turing", CallContext())
    assert r.content.startswith("Alan Turing: Alan Mathison Turing was an English mathematician")
    assert r.content.endswith(" (offline copy: online Wikipedia unreachable)") and not r.error
    # For a while it answers offline without trying the network again.
    assert wiki._offline_until > 0
    again = await wiki.run("Mount Everest", CallContext())
    assert again.content.startswith("Mount Everest:") and again.content.endswith("unreachable)")
    await wiki.close()


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="offline, online or auto"):
        Wikipedia(source="sometimes")
    with pytest.raises(ValueError, match="api_url"):
        Wikipedia(source="online", api_url="ftp://example")
