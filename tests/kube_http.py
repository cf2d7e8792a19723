"""Raw HTTP against kubesim for the tests that compare the JSON on the wire: the status code and
the body, nothing parsed away (the official client would fill defaults and drop unknown fields)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kubesim import tls

JSON = "application/json"


class Http:
    """`http(method, path, body)` is (status code, JSON body); `http.ok(...)` the body of a 200 or 201.

    `user_agent`: the header, which kubesim (as kube-apiserver) takes as the field manager of a
    write that names none; None sends urllib's own. `plain_text_errors`: an error body that is not
    JSON (kube-apiserver's "404 page not found" before a CRD is served) is returned as text
    instead of failing the test."""

    def __init__(self, url: str, *, user_agent: str | None = None, plain_text_errors: bool = False) -> None:
        self.url = url.rstrip("/")
        self.user_agent = user_agent
        self.plain_text_errors = plain_text_errors

    def __call__(
        self, method: str, path: str, body: Any = None, *, ctype: str = JSON, accept: str = JSON
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": accept}
        if self.user_agent is not None:
            headers["User-Agent"] = self.user_agent
        if data is not None:
            headers["Content-Type"] = ctype
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=tls.client_context()) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            if self.plain_text_errors and not raw.startswith(b"{"):
                return exc.code, raw.decode()
            return exc.code, json.loads(raw)

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        code, doc = self(method, path, body, **kw)
        assert code in (200, 201), (code, doc)
        assert isinstance(doc, dict)
        return doc
