"""Where the demo's story goes: a live table (rich.live, refreshed twice a second from the watched
objects) or, with --no-live, plain lines and a printout of the tables at the end of each act."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.live import Live

from gpuq.demo.view import Narration

# frame(narration) renders the screen; frame(None) only the tables.
Frame = Callable[[Narration | None], RenderableType]
REFRESH_PER_SECOND = 2


class PlainDisplay:
    """One line per act and per note, the tables after each act: for logs, CI and tests."""

    def __init__(self, console: Console, frame: Frame, clock: Callable[[], float]) -> None:
        self.console, self.frame, self.clock = console, frame, clock
        self.narration = Narration()

    def __enter__(self) -> PlainDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def act(self, title: str) -> None:
        self.narration.act = title
        self.console.print(f"\n[{self.clock():5.1f}s] {title}", style="bold", highlight=False)

    def note(self, text: str) -> None:
        self.narration.note(text)
        self.console.print(f"[{self.clock():5.1f}s]   {text}", highlight=False)

    def act_done(self) -> None:
        self.console.print(self.frame(None))


class LiveDisplay:
    """The act line, the latest notes and both tables, redrawn in place."""

    def __init__(self, console: Console, frame: Frame) -> None:
        self.narration = Narration()
        self.frame = frame
        self.live = Live(
            console=console,
            get_renderable=lambda: frame(self.narration),
            refresh_per_second=REFRESH_PER_SECOND,
        )

    def __enter__(self) -> LiveDisplay:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def act(self, title: str) -> None:
        self.narration.act = title
        self.narration.notes = []

    def note(self, text: str) -> None:
        self.narration.note(text)

    def act_done(self) -> None:
        return None
