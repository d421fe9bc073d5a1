"""A progress bar on stderr: tqdm's when it is installed, else a one-line fallback."""

from __future__ import annotations

import sys
from typing import Optional


class _Simple:
    def __init__(self, total: int):
        self.total, self.done, self.text = total, 0, ""
        self._draw()

    def set_description(self, text: str) -> None:
        self.text = text
        self._draw()

    def update(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def close(self) -> None:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self) -> None:
        if not sys.stderr.isatty():  # a log file gets no carriage-return animation
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.text[:60]:<60}"
        )
        sys.stderr.flush()


class _Silent:
    def set_description(self, text: str) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool = True, desc: Optional[str] = None):
    """An object with set_description(text), update(n) and close()."""
    if not enabled:
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Simple(total)
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
