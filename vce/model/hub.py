"""Reach the Hugging Face hub in seconds, or work from its cache.

Without network, huggingface_hub retries every request five times with growing waits before it
falls back to its cache: about 40 s per file here, over a minute for a model's config and
weights. `go_offline_unless_reachable` opens one TCP connection to the hub's host first (a few
seconds at most); when that fails, it switches huggingface_hub to offline mode for this process,
so what the cache holds still loads and anything missing is an error at once.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

__all__ = ["go_offline_unless_reachable", "hub_reachable", "CONNECT_TIMEOUT"]

# Seconds to wait for the hub's TCP handshake: a reachable hub answers in well under a second.
CONNECT_TIMEOUT = 5.0


def hub_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT) -> bool:
    """Whether a TCP connection to `endpoint`'s host (an https URL) opens within `timeout` seconds."""
    parts = urlsplit(endpoint)
    host = parts.hostname
    if not host:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:  # no DNS, refused, unreachable, timed out
        return False


def go_offline_unless_reachable(timeout: float = CONNECT_TIMEOUT) -> bool:
    """True when the hub can be reached (or offline mode was already chosen by the user: False).

    Otherwise sets huggingface_hub's offline mode for the rest of this process and returns
    False: downloads are then served from the cache or fail at once.
    """
    import huggingface_hub.constants as hub

    if hub.HF_HUB_OFFLINE:
        return False
    if hub_reachable(hub.ENDPOINT, timeout):
        return True
    hub.HF_HUB_OFFLINE = True
    return False
