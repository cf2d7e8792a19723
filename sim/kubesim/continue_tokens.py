"""LIST continue tokens as kube-apiserver writes and reads them: base64url of
`{"v":"meta.k8s.io/v1","rv":N,"start":"<key>"}` (shared/reference/continue-token-decoded.txt)."""

from __future__ import annotations

import base64
import json

from kubesim.errors import bad_request


def encode_continue(rv: int, start: str) -> str:
    doc = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """(rv, start key relative to the listed prefix).

    As apiserver's storage.DecodeContinue: a leading "/" is optional (the real
    server's page-2 token starts "/bar-4\\u0000", list-page2-limit2.json), and a
    start that path.Clean would change (``..``, ``.``, ``//``) is refused, so a
    token cannot range outside the listed prefix.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        doc = json.loads(raw)
        if doc.get("v") != "meta.k8s.io/v1":
            raise ValueError("unknown version")
        rv, start = int(doc["rv"]), str(doc["start"])
        key = start if start.startswith("/") else "/" + start
        if key != "/" and any(seg in ("", ".", "..") for seg in key[1:].split("/")):
            raise ValueError(start)
        return rv, key[1:]
    except (ValueError, KeyError, TypeError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from exc
