"""`opencortex serve`: the long-lived kernel of one home, and the frontends it serves.

It takes the home's lock first (`homelock`: a second kernel on the same home is
refused, naming the running one), then serves Emacs over EPC, the bridges the
configuration enables, and with `--ws PORT` the ChatEvent wire.

The first line on stdout is the EPC port, and nothing is printed before it.  It
comes as soon as the lock is held and the port is bound (without `--ws`; see
`serve_port`): `opencortex serve` reads its configuration after it, and the
kernel is built after it (imports, skills, archive).  Connections made meanwhile
wait in the socket's listen queue and are accepted, authenticated and answered
once the kernel is ready, so an early call waits and never fails; a configuration
that cannot be read, or a kernel that cannot be built, exits with its error on
stderr (Emacs, then authenticating, says it could not start).  With `--ws` the
kernel is built first, since the wire port goes in the connection file too.  The
secret comes from `$OPENCORTEX_SECRET` when Emacs starts the kernel (and is then
removed from the environment, so no child process inherits it, and hidden from
/proc/<pid>/environ with the provider keys: see `environ_scrub`), else the
kernel makes one.  Either way it writes `{"port", "secret", "pid", "home"}` (and
`ws_port`, `ws_token` with the wire) to the home's connection file,
`kernel-<hash of the home>.json` in a runtime directory only the user can enter
and write (refused otherwise), removed again on exit: that is how Emacs and
`opencortex client` find a kernel already running for their home.

It runs on uvloop where that is installed (`eventloop`; `event_loop` in the
configuration), its threads together on one CPU, moved when other work keeps
that CPU busy (`placement`; `cpu` in the configuration).  SIGTERM, SIGINT and SIGHUP stop it gracefully: the bridges stop
fetching, turns in flight get `stop_grace` seconds to finish, what the bridges
have not handled stays in their inboxes, then everything closes.  One that came
after the port line, before this loop took the signals over, was noted (see
`serve_port.noting_stop_signals`): nothing is built then.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from opencortex.eventloop import loop_name
from opencortex.placement import PLACEMENT, on_one_cpu
from opencortex.serve_port import STOP_SIGNALS, Bound, StopSignals, bound_port

if TYPE_CHECKING:     # the kernel's modules load after the port line (see `serve_bound`)
    from opencortex.config import Config
    from opencortex.emacs import EmacsService
    from opencortex.epc import KernelEpcServer
    from opencortex.kernel import Kernel
    from opencortex.llm import Backend

log = logging.getLogger(__name__)

YOUNG_COLLECTION = 10_000     # allocations between two young collections (Python: 700)


def emacs_frontend(config: Config, kernel: Kernel, loop: asyncio.AbstractEventLoop,
                   secret: str, listening: socket.socket
                   ) -> tuple[EmacsService, KernelEpcServer]:
    """Wire KERNEL to Emacs: actuator, approver, the methods, and the EPC server on the
    LISTENING socket."""
    from opencortex.approvals import ApprovalBook
    from opencortex.emacs import EmacsActuator, EmacsApprover, EmacsLink, EmacsService
    from opencortex.epc import KernelEpcServer
    settings = config.emacs
    link, book = EmacsLink(settings.call_timeout), ApprovalBook()
    actuator = EmacsActuator(link, settings.max_payload_bytes, config.chat.buffer)
    kernel.actuators.register(actuator)
    kernel.approvers["emacs"] = EmacsApprover(link, book)
    tools = kernel.actuators.for_target("tool")
    tools.emacs = lambda: link if link.connection is not None else None   # for Emacs tools
    service = EmacsService(kernel, link, book, actuator.piece_bytes,
                           max_waiting_turns=settings.max_waiting_turns)
    server = KernelEpcServer(loop, secret, service.methods(), listening=listening,
                             max_payload_bytes=settings.max_payload_bytes,
                             max_connections=settings.max_connections,
                             auth_timeout=settings.auth_timeout,
                             on_connect=link.connected, on_disconnect=link.disconnected)
    return service, server


async def serve(config: Config, *, port: int = 0, connection_file: Path | None = None,
                stdout: TextIO = sys.stdout, backend: Backend | None = None,
                stop: asyncio.Event | None = None, ws_port: int | None = None) -> int:
    """Run until SIGTERM, SIGINT or SIGHUP (or until STOP is set, when given).
    HomeInUse when another kernel runs on this home."""
    with bound_port(config.home, port=port, connection_file=connection_file) as bound:
        if ws_port is None:
            bound.announce(stdout)
        return await serve_bound(config, bound, stdout=stdout, backend=backend, stop=stop,
                                 ws_port=ws_port)


async def serve_bound(config: Config, bound: Bound, *, stdout: TextIO = sys.stdout,
                      backend: Backend | None = None, stop: asyncio.Event | None = None,
                      ws_port: int | None = None, noted: StopSignals | None = None) -> int:
    """Build the kernel and serve on BOUND (announced already, unless with WS_PORT: then
    once the wire listens), until a stop signal or STOP (see the module doc).  NOTED:
    the stop signals that came before this loop took them over (nothing is built then)."""
    loop = asyncio.get_running_loop()
    if stop is None:                    # a signal during the build stops the kernel after it
        stop = asyncio.Event()
        for number in STOP_SIGNALS:
            loop.add_signal_handler(number, stop.set)
    if noted is not None and noted.received is not None:
        return 0
    return await _build_and_serve(config, bound, loop, stdout=stdout, backend=backend,
                                  stop=stop, ws_port=ws_port)


async def _build_and_serve(config: Config, bound: Bound, loop: asyncio.AbstractEventLoop,
                           *, stdout: TextIO, backend: Backend | None, stop: asyncio.Event,
                           ws_port: int | None) -> int:
    """Build the kernel and its frontends on BOUND's socket, serve until STOP, then close."""
    from opencortex.runtime import build_kernel
    kernel = build_kernel(config, stream=sys.stderr, backend=backend)
    kernel.reporters["event loop"] = partial(loop_name, loop)
    watching = _place_threads(config)
    kernel.reporters["cpu"] = PLACEMENT.report
    if config.memory.write_process:
        kernel.archive.write_in_a_process()
    kernel.reporters["archive writes"] = kernel.archive.writes_report
    settle_collector()
    kernel.skills.after_reload.append(resettle_collector)
    service, server = emacs_frontend(config, kernel, loop, bound.secret, bound.listening)
    wire = await _start_wire(kernel, ws_port, bound.ws_token) if ws_port is not None else None
    if wire is not None:
        bound.announce(stdout, ws_port=wire.port, ws_token=bound.ws_token)
    _warn_at_start(kernel)
    await kernel.start(wait=False)   # MCP servers: their tools join as each comes up
    bridging = _start_bridges(config, kernel, stop)
    await server.start()
    try:
        await stop.wait()
    finally:
        await _finish_turns(service, bridging, config.stop_grace)
        await server.close()
        if wire is not None:
            await wire.close()
        await kernel.aclose()
        if watching is not None:
            watching.cancel()
        log.info("kernel stopped")
    return 0


def _place_threads(config: Config) -> asyncio.Task[None] | None:
    """The kernel's threads on one CPU, watched (see `placement`), as `cpu` says."""
    if not on_one_cpu(config) or not PLACEMENT.place():
        return None
    return asyncio.create_task(PLACEMENT.watch(), name="opencortex-cpu-watch")


def settle_collector() -> None:
    """Keep Python's cyclic garbage collector out of the turns' way once the kernel is
    built.  Under load (bench_load: 20 clients) it took about 90 µs of every turn, and
    each full collection paused every turn in flight for 30-70 ms.  What start-up made
    (about 50k objects: modules, skills, schemas) is moved out of its sight, and young
    objects are collected in batches of YOUNG_COLLECTION instead of 700: about 5 µs a
    turn after, and no full collection in that run."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])


def resettle_collector() -> None:
    """After /reload: what the old skills left (modules, functions: cycles) was frozen
    with start-up and would never be collected; collect it, then freeze what is left.
    The collection holds the GIL for a moment (tens of ms), once per reload."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


async def _start_wire(kernel: Kernel, port: int, token: str) -> Any:
    """The ChatEvent wire on 127.0.0.1:PORT (the `wire` extra: websockets)."""
    from opencortex.wire import start_wire
    return await start_wire(kernel, port=port, token=token)


def _start_bridges(config: Config, kernel: Kernel,
                   stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """Start the enabled bridges (their modules load only when one is enabled)."""
    if not config.bridges.enabled():
        return []
    from opencortex.bridges.runner import build_bridges, run_bridges
    bridges, problems = build_bridges(config, kernel)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return run_bridges(bridges, stop)


def _warn_at_start(kernel: Kernel) -> None:
    for error in kernel.skills.errors:
        print(f"warning: {error}", file=sys.stderr)
    if kernel.backend.warning:
        print(f"warning: {kernel.backend.warning}", file=sys.stderr)


async def _finish_turns(service: EmacsService, bridging: list[asyncio.Task[None]],
                        grace: float) -> None:
    """Let turns in flight finish within GRACE seconds (the bridges, told to stop, end
    their own); cancel what is left (a cancelled turn archives nothing)."""
    turns = [task for tasks in service.running.values() for task in tasks if not task.done()]
    waiting = turns + [task for task in bridging if not task.done()]
    if waiting:
        _, late = await asyncio.wait(waiting, timeout=grace)
        for task in late:
            task.cancel()
        if late:
            log.warning("%d turn(s) did not finish within %g s and were cancelled",
                        len(late), grace)
            await asyncio.wait(late, timeout=5)
