"""The client side of a running learner's HTTP API (``echo_learner.operator.api``), for
the commands that read it (``echo-learner status``, ``peers``, ``invite``).

The learner writes its API's URL to ``api.json`` in its data dir when it
starts; a command finds it there unless given ``--url``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from protocol.process.config import fail


def get(url: str | None, data_dir: Path, path: str, *, prog: str) -> Any:
    """The JSON the API answers at ``path``; exits with a message (``fail``) if
    no learner is found or it does not answer within 10 s."""
    import urllib.error
    import urllib.request

    if url is None:
        api_file = data_dir / "api.json"
        try:
            url = json.loads(api_file.read_text())["url"]
        except (OSError, ValueError, KeyError):
            fail(prog, f"no running learner found ({api_file} missing); pass --url or --data-dir")
    # A learner bound beyond loopback names its API token in the URL's fragment.
    url, _, fragment = url.partition("#")
    token = fragment.removeprefix("token=") if fragment.startswith("token=") else ""
    request = urllib.request.Request(
        url.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        fail(prog, f"the learner's status API at {url} did not answer: {exc}")
