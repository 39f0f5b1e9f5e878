"""The speculative-llm playground: baseline and speculative decoding side by side, live.

Start it with ``speculative-llm playground`` or from Python::

    from speculative_playground import build_app, launch

    launch(build_app())

``build_app`` and ``launch`` import Gradio on first use, so the pure modules
(``runner``, ``render``, ``history``, ``security``...) load without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speculative_playground.app import build_app, launch

__all__ = ["build_app", "launch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from speculative_playground import app

        return getattr(app, name)
    raise AttributeError(f"module 'speculative_playground' has no attribute {name!r}")
