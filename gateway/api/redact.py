"""Secrets taken out of what an SGLang server reports about itself, before a client sees it.

SGLang's `/server_info` returns its whole `ServerArgs`, with `api_key`, `admin_api_key` and
`ssl_keyfile_password` in clear, and the launch command that carries them (sgl-project/sglang
issue 37457). Relayed verbatim it would hand the backends' keys to every client of the gateway.
"""

from __future__ import annotations

import re

import orjson

SECRET_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password")
REDACTED = "<redacted>"
_SECRET_FLAGS = re.compile(r"(--(?:admin-api-key|api-key|ssl-keyfile-password)(?:=|\s+))(\S+)")


def redact_server_info(body: bytes) -> bytes:
    """`body` with every secret field and secret command-line flag value replaced by `<redacted>`."""
    try:
        info = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(info, dict):
        return body
    for name in SECRET_FIELDS:
        if info.get(name) is not None:
            info[name] = REDACTED
    command = info.get("launch_command")
    if isinstance(command, str):
        info["launch_command"] = _SECRET_FLAGS.sub(rf"\1{REDACTED}", command)
    return orjson.dumps(info)
