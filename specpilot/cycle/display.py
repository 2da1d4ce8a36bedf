"""The live view (rich) of phases and sub-agents on a terminal, one line per step off one
(a pipe, a file, CI), and the final summary table."""

from __future__ import annotations

import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from specpilot.cycle.state import PHASES, RunState
from specpilot.threads import noise_warning


def summary_table(state: RunState) -> Table:
    t = Table(title=f"{state.run_id}: phase {state.phase}", title_justify="left")
    for col in ("direction", "backend", "device", "status", "gain", "lower bound", "σ",
                "entry"):
        t.add_column(col, no_wrap=True)
    t.add_column("reason", overflow="fold", ratio=1)
    for d in state.directions:
        pct = lambda x: "" if x is None else f"{x:+.1%}"  # noqa: E731
        sigma = (d.verdict or {}).get("sigma")
        t.add_row(d.direction.id, d.direction.backend, d.device or "", d.status, pct(d.gain),
                  pct(d.lower_bound), "" if sigma is None else f"{sigma:.1%}", d.entry or "",
                  (d.reasons or [""])[-1][:160])
    return t


def footer(state: RunState) -> Text:
    lines = [f"sandbox: {state.sandbox}", f"planner: {state.planner or '-'}"]
    if state.load:
        lines.append(f"load: {state.load}")
    if state.analysis:
        f = state.analysis["factors"]
        lines.append("factors: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} n/a"
                                             for k, v in f.items()))
    if state.integration:
        lines.append(f"integration: {state.integration.get('result')}")
    if state.kernel_tuning:
        k = state.kernel_tuning
        worst = ", ".join(f"{r['category']} {r['over_bound']:.1f}x over bound"
                          for r in k.get("ranking", [])[:2])
        tried = "; ".join(f"{c['category']}: {c.get('result', '')}"
                          for c in k.get("categories", []))
        agent = (k.get("agent") or {})
        agent_txt = agent.get("result") or f"{agent.get('direction', {}).get('id')} " \
                                           f"{agent.get('status', '')}"
        lines.append(f"kernel tuning: {worst or 'no bound'}; {tried or 'nothing tuned'}; "
                     f"agent: {agent_txt}")
    if state.validation:
        lines.append(f"validation: {'PASS' if state.validation.get('passed') else 'FAIL'} - "
                     + "; ".join(state.validation.get("reasons", [])[:3]))
    return Text("\n".join(lines))


class LiveView:
    """Redraws phases, sub-agent rows and the latest messages as the cycle progresses."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.messages: dict[str, str] = {}
        self.state: RunState | None = None
        self.live: Live | None = None

    def __enter__(self):
        # transient: the summary printed after it is the only table left on the screen
        self.live = Live(console=self.console, refresh_per_second=2, transient=True)
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def note(self, text: str) -> None:
        """A line kept above the live view (where the run's log is)."""
        self.console.print(text, soft_wrap=True)

    def update(self, who: str, msg: str, state: RunState | None = None) -> None:
        self.messages[who] = f"{time.strftime('%H:%M:%S')} {msg}"
        self.state = state or self.state
        if self.live is not None:
            self.live.update(self.render())

    def render(self):
        parts = []
        if self.state is not None:
            phases = Text(" > ".join(f"[{p}]" if p == self.state.phase else p
                                     for p in PHASES))
            parts += [phases, summary_table(self.state)]
        msgs = Table.grid(padding=(0, 1))
        for who, msg in list(self.messages.items())[-8:]:
            msgs.add_row(Text(who, style="bold"), Text(msg))
        parts.append(msgs)
        return Group(*parts)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class PlainView:
    """Off a terminal: every progress message as one flushed line `HH:MM:SS [who] msg` on
    `stream` (stderr), nothing redrawn; the table is printed once, at the end."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.flush()

    def note(self, text: str) -> None:
        self.stream.write(one_line(text) + "\n")
        self.stream.flush()

    def update(self, who: str, msg: str, state: RunState | None = None) -> None:
        self.note(f"{time.strftime('%H:%M:%S')} [{who}] {msg}")


def final_console(terminal: bool) -> Console:
    """Where the summary goes: the terminal's stderr console as wide as it is; off a
    terminal stdout, wide enough that no column or footer line is cut to 80."""
    return Console(stderr=True) if terminal else Console(file=sys.stdout, width=250,
                                                          soft_wrap=True)


def make_view(terminal: bool):
    return LiveView() if terminal else PlainView()


def noise_warnings(state: RunState) -> list[str]:
    """One warning, for the noisiest controller verdict of the run, if its bar was out of
    reach of any plausible gain."""
    verdicts = [d.verdict for d in state.directions if d.verdict]
    verdicts += [v for v in ((state.integration or {}).get("verdict"),) if v]
    worst = max(verdicts, key=lambda v: v.get("threshold") or 0.0, default=None)
    said = worst and noise_warning(worst.get("sigma"), worst.get("threshold"))
    if not said:
        return []
    noisy = sum(bool(noise_warning(v.get("sigma"), v.get("threshold"))) for v in verdicts)
    return [f"{said} ({noisy} of {len(verdicts)} verdicts)"]
