"""The Prometheus HTTP API as the prometheus source reads it: instant queries of range selectors
(matrix results) and the node names that have series in a window.

prometheus-api-client's `custom_query` decodes a response with `response.json()`: Python's
json module builds the whole document as dicts and lists, ~10x its size in memory and most of
a poll's CPU at fleet scale. Through a PrometheusConnect's own session (same headers, auth, TLS
and no-redirect policy), the body is decoded here by msgspec instead, several times faster, and
a poll reads its nodes in bounded queries (prometheus_shard.py), so no response grows with the
fleet. A stand-in client that only has `custom_query` (tests) is read through it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pipeline.errors import SourceError
from pipeline.redact import redact

# Longer queries go as a POST form (Prometheus, Thanos and Mimir take both); URLs past ~8 kB
# are refused by many proxies.
GET_LIMIT = 4000


class _Data(msgspec.Struct):
    resultType: str  # noqa: N815 (the API's name)
    result: list[dict[str, Any]]


class _Response(msgspec.Struct):
    status: str
    data: _Data | None = None
    error: str = ""


class _Labels(msgspec.Struct):
    status: str
    data: list[str] = []
    error: str = ""


class PromReader:
    """Matrix queries and label values, raising SourceError with the query and the reason."""

    def __init__(self, client: Any, url: str, timeout_s: float = 30.0) -> None:
        self._client = client
        self._url = url
        self._timeout_s = timeout_s
        self._session = getattr(client, "_session", None)
        self._base = str(getattr(client, "url", "")).rstrip("/")

    def matrix(self, series: str, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
        """The raw points of `series` in (start, end]: `series[<window>ms]` at `end`."""
        query = f"{series}[{end_ms - start_ms}ms]"
        params = {"time": f"{end_ms / 1000:.3f}"}
        if self._session is None:  # a stand-in client
            result = self._checked(query, lambda: self._client.custom_query(query, params=params))
            if not isinstance(result, list):
                raise SourceError(f"prometheus query {query!r}: expected a list, got {result!r}")
            return result
        body = self._checked(query, lambda: self._get("/api/v1/query", query, params))
        try:
            response = msgspec.json.decode(body, type=_Response)
        except msgspec.DecodeError as exc:
            raise SourceError(f"prometheus query {query!r}: not a query response: {exc}") from exc
        if response.status != "success" or response.data is None:
            raise SourceError(f"prometheus query {query!r} failed: {response.error}")
        return response.data.result

    def node_names(self, label: str, series: str, start_ms: int, end_ms: int) -> list[str]:
        """Values of `label` on the series matching `series` in [start, end] (Prometheus's
        label-values API: an index lookup, no samples read)."""
        what = f"label {label} values of {series}"
        params = {"match[]": series, "start": f"{start_ms / 1000:.3f}",
                  "end": f"{end_ms / 1000:.3f}"}  # fmt: skip
        if self._session is None:
            return list(self._checked(what, lambda: self._client.get_label_values(label, params)))
        path = f"/api/v1/label/{label}/values"  # GET only (the API has no POST form of it)
        body = self._checked(what, lambda: self._get(path, "", params))
        try:
            response = msgspec.json.decode(body, type=_Labels)
        except msgspec.DecodeError as exc:
            raise SourceError(f"prometheus {what}: not a label-values response: {exc}") from exc
        if response.status != "success":
            raise SourceError(f"prometheus {what} failed: {response.error}")
        return response.data

    def _get(self, path: str, query: str, params: dict[str, str]) -> bytes:
        assert self._session is not None
        url = f"{self._base}{path}"
        args = {"query": query, **params} if query else params
        if len(query) > GET_LIMIT:  # a query naming many nodes: too long for a URL
            response = self._session.post(url, data=args, timeout=self._timeout_s)
        else:
            response = self._session.get(url, params=args, timeout=self._timeout_s)
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}: {response.text[:300]!r}")
        return bytes(response.content)

    def _checked(self, what: str, call: Any) -> Any:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return call()
        except requests.ConnectionError as exc:
            raise SourceError(
                f"cannot reach Prometheus at {redact(self._url)} (sources.prometheus_url, "
                f"FLEETPULSE_SOURCES__PROMETHEUS_URL): {_reason(exc)}"
            ) from exc
        except (PrometheusApiClientException, OSError, ValueError) as exc:
            raise SourceError(f"prometheus query {what!r} failed: {exc}") from exc


def _reason(exc: BaseException) -> str:
    """The innermost cause of a connection failure ("[Errno 111] Connection refused"), not
    urllib3's paragraph around it."""
    text = str(exc)
    marker = text.rfind("[Errno")
    return text[marker:].rstrip("'\")") if marker >= 0 else type(exc).__name__
