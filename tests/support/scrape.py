"""Reading a daemon's metrics endpoint the way a scraper does, for the tests."""

from __future__ import annotations

import urllib.request


def scrape(port: int) -> dict[str, float]:
    """The unlabelled samples of the metrics endpoint on ``port``, by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {name: float(value) for line in text.splitlines()
            if line and not line.startswith("#") and "{" not in line
            for name, value in [line.rsplit(" ", 1)]}
