"""The Textual dashboard: a header (server, connection, memory per device), the models table,
a filter, and the recent events; keys to load and unload the selected model.

It polls the daemon every `interval` through `DaemonClient`. A poll that fails marks the
monitor disconnected and the next tick simply tries again, so a daemon that comes back (on
the same URL) is picked up without a restart. Load and unload run as workers, so a long load
never freezes the screen, and their refusals (401/403) and errors are notifications.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from snoozeml.monitor.client import DaemonClient, DaemonRefused, MonitorError
from snoozeml.monitor.latency import LatencyTracker
from snoozeml.monitor.status import EventRow, Status
from snoozeml.monitor.table import (
    COLUMNS,
    Row,
    build_rows,
    cells,
    filter_rows,
    format_bytes,
    format_duration,
    memory_bar,
    next_sort,
    sort_rows,
    state_counts,
)

STATE_STYLES = {"READY": "bold green", "LOADING": "bold yellow", "UNLOADED": "dim",
                "FAILED": "bold red", "UNLOADING": "bold magenta"}
EVENT_STYLES = {"model_loaded": "green", "model_load_failed": "red", "model_unloaded": "dim",
                "memory_evicting": "yellow", "replica_added": "cyan",
                "replica_removed": "cyan", "replica_refused": "red"}
BAR_WIDTH = 30
NUMBER_WIDTH = 8  # `1023 MiB`, `4m05s`, `12.3ms`: every numeric cell fits
EVENTS_SHOWN = 100

HELP = """\
[b]snooze monitor[/b]: one daemon's models, polled over HTTP.

[b]Keys[/b]
  [b]l[/b]       load the selected model now (needs an admin key with auth on)
  [b]u[/b]       unload the selected model now (admin too)
  [b]/[/b]       filter the models by name; [b]Enter[/b] or [b]Esc[/b] goes back to the table
              ([b]Esc[/b] also clears the filter)
  [b]s[/b]       sort by the next column (the daemon's order, then each column)
  [b]r[/b]       reverse the sort
  [b]↑ ↓ PgUp PgDn Home End[/b]  select a model
  [b]?[/b]       this help
  [b]q[/b]       quit

[b]Columns[/b]
  STATE       READY, LOADING, UNLOADING, UNLOADED, FAILED
  REPLICAS    running replicas;  IN-FLIGHT, QUEUED: requests held, of them waiting
  REQ/S, P50, P99   requests and their latency between the last two polls, from
              /metrics (snooze_request_duration_seconds); "-" without /metrics
  MEMORY      what the model holds against its device's budget
  IDLE IN     time until the idle timer unloads it ("pinned": never)
  COLD START  how long its last load took

Press any key to close."""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: auto; max-width: 90%; border: round $accent;
                          padding: 1 2; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)

    def on_key(self) -> None:
        self.dismiss()


class FilterInput(Input):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave(True)", "Clear filter", show=False)]

    def action_leave(self, clear: bool) -> None:
        if clear:
            self.value = ""
        self.screen.query_one("#models").focus()


class ModelsTable(DataTable[Text]):
    """The models table; Home and End move the selection to the first and last model."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("home", "scroll_top", "First", show=False),
        Binding("end", "scroll_bottom", "Last", show=False),
    ]


class MonitorApp(App[None]):
    """`MonitorApp(url, api_key, interval).run()`; `run_test()` in tests."""

    TITLE = "snooze monitor"
    CSS = """
    #summary { height: auto; padding: 0 1; background: $boost; }
    #filter { height: 3; margin: 0 0; }
    #models { height: 3fr; }
    #events-pane { height: 2fr; min-height: 6; border-top: solid $accent; }
    #events { padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("l", "load", "Load"),
        Binding("u", "unload", "Unload"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("r", "reverse", "Reverse"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, url: str, api_key: str | None = None, interval: float = 1.0) -> None:
        super().__init__()
        self.url = url
        self.interval = interval
        self.client = DaemonClient(url, api_key)
        # What the screen shows; public so that tests and scripts can read it.
        self.connected = False
        self.problem: str | None = None  # why the last poll failed
        self.status: Status | None = None
        self.rows: list[Row] = []  # the table's rows: filtered and sorted
        self.notices: list[str] = []  # every notification shown, oldest first
        self.polls = 0  # polls that succeeded
        self.sort_key: str | None = None
        self.sort_reverse = False
        self._all_rows: list[Row] = []
        self._metrics_note: str | None = None
        self._refused = False  # the last poll was answered 401/403: up, but not for us
        self._latency = LatencyTracker()
        self._poll_lock = asyncio.Lock()
        # Held here, not queried: a poll may land while the help screen is on top.
        self._summary = Static(id="summary")
        self._filter = FilterInput(placeholder="/ to filter models by name", id="filter")
        self._table = ModelsTable(id="models", cursor_type="row", zebra_stripes=True)
        self._events = Static(id="events")
        self._events_pane = VerticalScroll(self._events, id="events-pane")

    # --- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield self._summary
        yield self._filter
        yield self._table
        yield self._events_pane
        yield Footer()

    def on_mount(self) -> None:
        self._events_pane.border_title = "recent events (UTC, newest first)"
        self._add_columns()
        self._table.focus()
        self._show_summary()
        self.call_later(self.poll)  # the first poll now, without holding up the first paint
        self.set_interval(self.interval, self.poll)

    async def on_unmount(self) -> None:
        await self.client.aclose()

    # --- polling -----------------------------------------------------------------------------

    async def poll(self) -> None:
        """One round: read the daemon and redraw. Never raises: a failure is shown."""
        async with self._poll_lock:
            try:
                answer = await self.client.poll()
            except DaemonRefused as exc:
                self._disconnected(exc.message, refused=exc.status in (401, 403))
                return
            except MonitorError as exc:
                self._disconnected(exc.message)
                return
            except Exception as exc:  # the boundary: shown in the header, polling goes on
                self._disconnected(f"{type(exc).__name__}: {exc}")
                return
            previous = self.status
            if previous is None or previous.server.started_at != answer.status.server.started_at:
                self._latency.reset()  # a new daemon process: its counters began again
            window = self._latency.update(answer.histograms, answer.at)
            self.connected, self.problem, self._refused = True, None, False
            self.status = answer.status
            self._metrics_note = answer.metrics_note
            self.polls += 1
            self._all_rows = build_rows(answer.status.models, window)
            self._show_summary()
            self._show_rows()
            self._show_events()

    def _disconnected(self, problem: str, refused: bool = False) -> None:
        self.connected, self.problem, self._refused = False, problem, refused
        self._latency.reset()
        self._show_summary()

    # --- drawing -----------------------------------------------------------------------------

    def _show_summary(self) -> None:
        text = Text()
        status = self.status
        if status is not None:
            server = status.server
            text.append(f"{server.name or 'snoozeml'} {server.version}", "bold")
            text.append(f"  up {format_duration(server.uptime_s)}  ")
        text.append(self.url, "underline")
        text.append("  ")
        if self.connected:
            text.append("● connected", "bold green")
            if status is not None and status.server.draining:
                text.append("  draining", "bold yellow")
            if self._metrics_note:
                text.append(f"  (latency: {self._metrics_note})", "dim")
        elif self.problem is None:
            text.append("● connecting…", "yellow")
        else:
            text.append("● no access" if self._refused else "● disconnected", "bold red")
            text.append(f"  {self.problem}; retrying every {self.interval:g}s", "red")
        if status is not None:
            text.append(f"\n{len(status.models)} models:")
            for state, count in state_counts(status.models):
                text.append(f"  {count} ")
                text.append(state, STATE_STYLES.get(state, ""))
        for device in status.devices if status is not None else ():
            filled, share = memory_bar(device.used_bytes, device.budget_bytes, BAR_WIDTH)
            colour = "green" if share is None or share < 0.7 else \
                "yellow" if share < 0.9 else "red"
            text.append(f"\n{device.name:<8}")
            text.append("█" * filled, colour)
            text.append("░" * (BAR_WIDTH - filled), "dim")
            budget = "no budget" if device.budget_bytes is None else \
                format_bytes(device.budget_bytes)
            percent = "" if share is None else f"  {share:.0%}"
            text.append(f"  {format_bytes(device.used_bytes)} / {budget}{percent}")
        self._summary.update(text)

    def _add_columns(self) -> None:
        for column in COLUMNS:
            title = column.title
            if column.key == self.sort_key:
                # ▼ descending, ▲ ascending.
                title += " ▲" if column.numeric == self.sort_reverse else " ▼"
            if column.numeric:  # a fixed width, so that the title can be right-aligned too
                width = max(len(title), NUMBER_WIDTH)
                self._table.add_column(Text(title.rjust(width)), width=width, key=column.key)
            else:
                self._table.add_column(Text(title), key=column.key)

    def _show_rows(self, selected: str | None = None) -> None:
        """Redraw the table from the last poll, keeping the cursor on the selected model."""
        table = self._table
        selected = selected or self.selected_model
        text = self._filter.value
        self.rows = sort_rows(filter_rows(self._all_rows, text), self.sort_key,
                              self.sort_reverse)
        table.clear()
        for row in self.rows:
            table.add_row(*_styled(row), key=row.model.name)
        names = [row.model.name for row in self.rows]
        if selected in names:
            table.move_cursor(row=names.index(selected), animate=False)

    def _show_events(self) -> None:
        status = self.status
        pane = self._events
        if status is None:
            return
        if status.events is None:
            pane.update(Text("This daemon doesn't report recent events "
                             "(no recent_events in /admin/status).", "dim"))
            return
        if not status.events:
            pane.update(Text("No events yet.", "dim"))
            return
        text = Text()
        for event in reversed(status.events[-EVENTS_SHOWN:]):
            if text:
                text.append("\n")
            _append_event(text, event)
        pane.update(text)

    # --- the selected model, and the keys ----------------------------------------------------

    @property
    def selected_model(self) -> str | None:
        """The model name under the table's cursor, if any."""
        table = self._table
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return None if key.value is None else str(key.value)

    def action_load(self) -> None:
        self._act("load")

    def action_unload(self) -> None:
        self._act("unload")

    def _act(self, verb: str) -> None:
        model = self.selected_model
        if model is None:
            self.tell("No model selected.", error=True)
            return
        self.tell(f"{verb}ing {model}…")
        self._run_action(verb, model)

    @work(group="actions")
    async def _run_action(self, verb: str, model: str) -> None:
        action = self.client.load if verb == "load" else self.client.unload
        try:
            await action(model)
        except MonitorError as exc:
            self.tell(exc.message, error=True)
        except Exception as exc:  # the boundary of a key press: shown, never a crash
            self.tell(f"{verb} {model!r} failed: {type(exc).__name__}: {exc}", error=True)
        else:
            self.tell(f"{model} {verb}ed")
        await self.poll()

    def tell(self, message: str, error: bool = False) -> None:
        """A notification on screen, also kept in `notices`."""
        self.notices.append(message)
        self.notify(message, severity="error" if error else "information",
                    timeout=8 if error else 3)

    def action_filter(self) -> None:
        self._filter.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self._show_rows()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._table.focus()

    def action_sort(self) -> None:
        self._sort_by(next_sort(self.sort_key), reverse=False)

    def action_reverse(self) -> None:
        self._sort_by(self.sort_key, reverse=not self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = event.column_key.value
        same = key == self.sort_key
        self._sort_by(key, reverse=not self.sort_reverse if same else False)

    def _sort_by(self, key: str | None, reverse: bool) -> None:
        self.sort_key, self.sort_reverse = key, reverse
        selected = self.selected_model
        self._table.clear(columns=True)
        self._add_columns()
        self._show_rows(selected)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def _styled(row: Row) -> list[Text]:
    out = []
    for column, cell in zip(COLUMNS, cells(row), strict=True):
        style = STATE_STYLES.get(cell, "") if column.key == "state" else ""
        if column.key == "name" and row.model.state == "UNLOADED":
            style = "dim"
        out.append(Text(cell, style=style, justify="right" if column.numeric else "left"))
    return out


def _append_event(text: Text, event: EventRow) -> None:
    clock = event.time[11:23] if len(event.time) >= 23 else event.time
    text.append(f"{clock}  ", "dim")
    text.append(f"{event.kind:<18}", EVENT_STYLES.get(event.kind, ""))
    text.append(f" {event.model or '-':<16} ", "bold")
    text.append(event.detail)
