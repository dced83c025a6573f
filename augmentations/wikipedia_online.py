"""Online Wikipedia through the `wikipedia-api` package (module `wikipediaapi`).

The package issues the MediaWiki API calls itself (`action=query&prop=extracts` for a page's lead,
`list=search` when no page has the query as its title) against `https://<language>.wikipedia.org/w/api.php`,
a URL it builds internally. Its documented hook for anything else is the httpx transport it accepts;
`EndpointTransport` uses it to send the same requests to another MediaWiki API endpoint (`api_url`: a
mirror, a local MediaWiki, or a test server on loopback), so the package's own request and parsing code
runs either way. Blocking: call from a worker thread.
"""

from __future__ import annotations

from typing import Any

import httpx


class EndpointTransport(httpx.BaseTransport):
    """Rewrites each request's scheme, host, port and path to `api_url`, keeping its query string."""

    def __init__(self, api_url: str) -> None:
        self.url = httpx.URL(api_url)
        if self.url.scheme not in ("http", "https") or not self.url.host:
            raise ValueError(f"wikipedia api_url must be an http(s) URL, not {api_url!r}")
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(scheme=self.url.scheme, host=self.url.host, port=self.url.port,
                                            path=self.url.path)
        request.headers["Host"] = self.url.netloc.decode("ascii")
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


class OnlineWikipedia:
    def __init__(self, user_agent: str, language: str = "en", api_url: str | None = None, timeout: float = 5.0,
                 retries: int = 1) -> None:
        import wikipediaapi

        self._transport: httpx.BaseTransport = EndpointTransport(api_url) if api_url else httpx.HTTPTransport()
        self.wiki: Any = wikipediaapi.Wikipedia(user_agent=user_agent, language=language, max_retries=retries,
                                                retry_wait=0.5, timeout=timeout, transport=self._transport)

    def lookup(self, query: str) -> tuple[str, str] | None:
        """(title, lead) of the page titled `query` (redirects followed), else of the best search hit."""
        page = self.wiki.page(query)
        if not page.summary:  # a missing page has an empty summary
            hits = self.wiki.search(query, limit=1)
            page = next(iter(hits.pages.values()), None)
            if page is None or not page.summary:
                return None
        return page.title, page.summary

    def close(self) -> None:
        self._transport.close()
