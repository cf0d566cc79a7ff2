"""A person as the user: ``muarl chat`` puts someone in the simulated user's seat, in a terminal.

:class:`HumanUser` is an ordinary :class:`~muarl.users.base.UserSimulator` whose replies are read from a
text stream (stdin by default), so the episode runs through the same :func:`~muarl.rollout.run_episode`
as every training and evaluation rollout and is scored and saved the same way. That also makes it
testable: a test feeds lines to a real ``python -m muarl chat`` process.

The person sees the task's scenario (what they want, the facts they know), the agent's messages and,
unlike a simulated user, every tool call and result as it happens (:class:`EchoPolicy`), because the
point of chatting with an agent is usually to watch what it does. Lines starting with ``/`` are commands:

- ``/done [last words]``: end the conversation (the user's stop signal, like ``###STOP###``)
- ``/quit``: end it now (recorded as ``metadata["user_quit"]``); Ctrl-C does the same (while the agent
  is working, at its next message)
- ``/phone TOOL [JSON or key=value ...]``: act on your own device (dual-control domains, e.g. telecom)
- ``/tools``: list the device tools; ``/task``: show the scenario again; ``/help``: this list

End of input ends the conversation like ``/done`` (recorded as ``metadata["user_eof"]``), so a piped
script that runs out of lines still gets a scored, saved episode.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from muarl.policies.base import AgentTurn, Policy, PolicySession
from muarl.rollout import EpisodeConfig, run_episode
from muarl.types import Message, Task, Trajectory
from muarl.users.base import STOP, Act, SimulatorFault, UserReply, UserSession, UserSimulator

if TYPE_CHECKING:
    from muarl.domain import Domain

MAX_SHOWN = 1500  # characters of a tool result shown in a panel (the agent still sees all of it)
HELP = ("Type your reply and press Enter. Commands: /done [last words] ends the conversation; /quit ends it "
        "now; /phone TOOL [JSON or key=value ...] acts on your device; /tools lists device tools; /task shows "
        "your scenario again; /help shows this.")


class HumanUser(UserSimulator):
    """A user simulator whose every turn is typed by a person (one episode at a time).

    ``stream`` is where the person's lines come from (stdin by default); ``echo`` writes each line read
    back to the console, which keeps a transcript readable when the input is piped (the default when
    the stream is not a terminal). Reading blocks the event loop on purpose: nothing else runs during a
    chat, and a blocking read is what lets Ctrl-C at the prompt end the conversation cleanly.
    """

    name = "human"

    def __init__(self, domain: Domain, stream: TextIO | None = None, console: Console | None = None,
                 echo: bool | None = None):
        self.domain = domain
        self.stream = stream if stream is not None else sys.stdin
        self.console = console or Console()
        self.echo = echo if echo is not None else not _isatty(self.stream)
        self.reading = False  # inside the blocking read of the person's line
        self.interrupted = False  # Ctrl-C came while the agent was working: quit at the next prompt

    def on_sigint(self, signum: int, frame: Any) -> None:
        """Ctrl-C: at the prompt it interrupts the read (the conversation ends as /quit); while the agent
        works it ends the conversation at the next prompt, so the episode is still scored and saved; a
        second Ctrl-C before then aborts at once."""
        if self.reading or self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True

    def session(self, task: Task, seed: int) -> HumanSession:
        return HumanSession(self, task)


class HumanSession(UserSession):
    """One conversation's person."""

    def __init__(self, user: HumanUser, task: Task):
        self.user = user
        self.task = task
        self.console = user.console

    async def start(self) -> UserReply:
        self.console.print("[bold]You start the conversation.[/bold] (/help for commands)")
        while True:
            line = self._read()
            if line is None or line.startswith(("/quit", "/done")):
                why = "end of input" if line is None else line.split()[0]
                raise SimulatorFault(f"the person ended the chat before saying anything ({why})")
            if line.startswith("/phone"):
                self.console.print("[yellow]Say something first; your device is available once the agent "
                                   "has answered.[/yellow]")
                continue
            if line.startswith("/"):
                self._command(line)
                continue
            return UserReply(text=line)

    async def reply(self, agent_text: str, act: Act) -> UserReply:
        self.console.print(Panel(escape(agent_text or "(empty message)"), title="agent", title_align="left",
                                 border_style="cyan"))
        while True:
            line = self._read()
            if line is None:
                self.console.print("[dim](end of input: the conversation ends here)[/dim]")
                return UserReply(text=STOP, stop="stop", metadata={"eof": 1})
            if line == "/quit" or line.startswith("/quit "):
                return UserReply(text=STOP, stop="stop", metadata={"quit": 1})
            if line == "/done" or line.startswith("/done "):
                last = line[len("/done"):].strip()
                return UserReply(text=f"{last} {STOP}".strip(), stop="stop")
            if line == "/phone" or line.startswith("/phone "):
                await self._phone(line[len("/phone"):].strip(), act)
                continue
            if line.startswith("/"):
                self._command(line)
                continue
            return UserReply(text=line)

    # -- input ---------------------------------------------------------------------------------------------
    def _read(self) -> str | None:
        """The person's next non-empty line; None at end of input. Ctrl-C at the prompt means /quit."""
        while True:
            if self.user.interrupted:
                return "/quit"
            self.console.print("[bold green]you>[/bold green] ", end="")
            try:
                self.user.reading = True
                if self.user.interrupted:  # Ctrl-C between the check above and here
                    raise KeyboardInterrupt
                raw = self.user.stream.readline()
            except KeyboardInterrupt:
                self.console.print()
                return "/quit"
            finally:
                self.user.reading = False
            if raw == "":
                self.console.print()
                return None
            line = raw.strip()
            if self.user.echo:
                self.console.print(escape(line), highlight=False)
            if line:
                return line

    def _command(self, line: str) -> None:
        word = line.split()[0]
        if word == "/help":
            self.console.print(escape(HELP))
        elif word == "/task":
            show_scenario(self.console, self.user.domain, self.task)
        elif word == "/tools":
            self._tools()
        else:
            self.console.print(f"[red]unknown command {escape(word)}[/red]. {escape(HELP)}")

    def _tools(self) -> None:
        tools = self.user.domain.user_tools
        if not tools:
            self.console.print(f"[yellow]In {self.user.domain.name} you have no device tools; just talk.[/yellow]")
            return
        table = Table(title="your device (use /phone TOOL ...)")
        table.add_column("tool")
        table.add_column("arguments")
        table.add_column("what it does")
        for t in tools:
            args = ", ".join(t.spec.parameters.get("properties", {}))
            table.add_row(t.name, args or "-", t.spec.description.splitlines()[0])
        self.console.print(table)

    async def _phone(self, rest: str, act: Act) -> None:
        if not self.user.domain.user_tools:
            self.console.print(f"[yellow]In {self.user.domain.name} you have no device tools.[/yellow]")
            return
        if not rest:
            self._tools()
            return
        name, _, arg_text = rest.partition(" ")
        try:
            arguments = parse_arguments(arg_text)
        except ValueError as err:
            self.console.print(f"[red]{escape(str(err))}[/red]")
            return
        output = await act(name, arguments)
        style = "red" if str(output).startswith("Error") else "magenta"
        self.console.print(Panel(escape(_clip(str(output))), title=f"your device: {escape(name)}",
                                 title_align="left", border_style=style))


def parse_arguments(text: str) -> dict[str, Any]:
    """Device-tool arguments typed by a person: a JSON object, or ``key=value`` words (values parsed as
    JSON when they are JSON, so ``mode=4g`` is a string and ``count=3`` a number)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as err:
            raise ValueError(f"arguments are not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")
        return value
    out: dict[str, Any] = {}
    for word in shlex.split(text):
        key, sep, raw = word.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value or a JSON object, got {word!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


class EchoPolicy(Policy):
    """Wraps any policy and prints its tool calls and their results on a console as they happen."""

    def __init__(self, inner: Policy, console: Console):
        self.inner = inner
        self.console = console
        self.name = inner.name

    def session(self, domain: Domain, task: Task, seed: int | None = None) -> EchoSession:
        return EchoSession(self.inner.session(domain, task, seed=seed), self.console)


class EchoSession(PolicySession):
    """Shows the results of the previous turn's calls, then the agent's new calls, around each turn."""

    def __init__(self, inner: PolicySession, console: Console):
        self.inner = inner
        self.console = console

    async def next(self, new_messages: list[Message]) -> AgentTurn:
        show_tool_results(self.console, new_messages)
        turn = await self.inner.next(new_messages)
        if turn.message.tool_calls:
            if turn.message.content.strip():
                self.console.print(f"[dim]agent (thinking aloud): {escape(turn.message.content.strip())}[/dim]")
            for call in turn.message.tool_calls:
                args = json.dumps(call.arguments, ensure_ascii=False)
                self.console.print(Panel(escape(f"{call.name}({args})"), title="tool call", title_align="left",
                                         border_style="yellow"))
        for problem in turn.parse_errors:
            self.console.print(f"[red]malformed tool call: {escape(problem)}[/red]")
        return turn

    def close(self) -> dict[str, Any]:
        return self.inner.close()


def show_tool_results(console: Console, messages: list[Message]) -> None:
    for m in messages:
        if m.role != "tool":
            continue
        bad = m.name == "error" or m.content.startswith("Error")
        console.print(Panel(escape(_clip(m.content)), title=f"result of {escape(m.name or 'tool')}",
                            title_align="left", border_style="red" if bad else "blue"))


def show_scenario(console: Console, domain: Domain, task: Task) -> None:
    """What the person plays: the instruction, the facts they know (and which to hold back), the goals."""
    s = task.scenario
    facts = Table(show_header=True, box=None, pad_edge=False)
    facts.add_column("fact")
    facts.add_column("value")
    facts.add_column("")
    for key, value in s.known.items():
        facts.add_row(key, escape(str(value)), "only when asked" if key in s.withheld else "")
    goals = "\n".join(f"- {escape(i.description)}" + (" (the agent should refuse; insist a little)"
                                                       if i.out_of_policy else "") for i in s.intents)
    body = Table.grid(padding=(0, 1))
    body.add_row(f"[bold]{escape(s.persona)}[/bold]")
    body.add_row(escape(task.instruction))
    body.add_row("")
    body.add_row("[bold]What you want[/bold]\n" + (goals or "-"))
    body.add_row("[bold]What you know[/bold]")
    body.add_row(facts)
    if domain.user_tools:
        body.add_row("[bold]Your device[/bold]: /tools lists what you can do, /phone TOOL runs it.")
    body.add_row(f"[dim]{escape(HELP)}[/dim]")
    console.print(Panel(body, title=f"your task: {escape(task.id)} ({escape(task.family)})", title_align="left",
                        border_style="green"))


def show_outcome(console: Console, traj: Trajectory) -> None:
    """The score of the finished conversation: reward, checks, violations and the difference from gold."""
    r = traj.reward
    if r is None:
        from muarl.faults import fault_message

        why = f" (fault {traj.fault_kind}: {escape(fault_message(traj))})" if traj.fault_kind else ""
        console.print(f"[red]the episode was not scored[/red]{why}")
        return
    style = "green" if r.reward == 1.0 else "red"
    lines = [f"[{style}]reward {r.reward:.1f}[/{style}]  (database matches gold: {r.db_match}; required outputs "
             f"said: {r.outputs_ok}; TCR {r.tcr:.2f}; stop: {escape(traj.stop_reason)}; turns {traj.turns})"]
    lines += [f"[red]failed check[/red] {escape(c.name)} {escape(c.detail)}" for c in r.checks if not c.passed]
    lines += [f"[red]violation[/red] {v.kind}: {escape(v.tool)} {escape(v.detail)}" for v in r.violations]
    lines += [f"diff: {escape(d)}" for d in r.diff[:20]]
    if traj.fault_kind:
        from muarl.faults import fault_message

        lines.append(f"[yellow]fault ({traj.fault_kind}), not the agent's doing: {escape(fault_message(traj))}[/yellow]")
    console.print(Panel("\n".join(lines), title="outcome", title_align="left", border_style=style))


def run_chat(domain: Domain, task: Task, policy: Policy, *, stream: TextIO | None = None,
             console: Console | None = None, config: EpisodeConfig | None = None,
             save: str | Path | None = None) -> Trajectory:
    """Play one episode of ``task`` with a person as the user; show the outcome; append it to ``save``.

    Ctrl-C ends the conversation like ``/quit`` (see :meth:`HumanUser.on_sigint`), so an interrupted chat
    is still scored and saved. That is why this runs its own event loop rather than :func:`asyncio.run`,
    whose Ctrl-C handling would cancel the episode and lose it.
    """
    console = console or Console()
    show_scenario(console, domain, task)
    user = HumanUser(domain, stream, console)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, user.on_sigint) if main else None
    loop = asyncio.new_event_loop()
    try:
        # a person takes the time they take: no user-turn limit (their input is read synchronously anyway)
        limits = replace(config or EpisodeConfig(), user_timeout=None)
        traj = loop.run_until_complete(run_episode(domain, task, EchoPolicy(policy, console), user, 0, limits))
    finally:
        loop.close()
        if main:
            signal.signal(signal.SIGINT, previous)
    last = max((i for i, m in enumerate(traj.messages) if m.role == "assistant"), default=-1)
    show_tool_results(console, traj.messages[last + 1:])  # calls whose results no later turn showed
    show_outcome(console, traj)
    if save is not None:
        path = Path(save)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(traj.model_dump_json() + "\n")
        console.print(f"saved the conversation to {escape(str(path))}")
    return traj


def _clip(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + f" ... ({len(text) - MAX_SHOWN} more characters)"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
