"""A running container as the emulated images see it, and the registry of emulated programs.

Each operand module registers the executables it emulates with :func:`program`::

    @program("driver-manager")
    async def driver_manager(proc: Proc, argv: tuple[str, ...]) -> None: ...

A program returns to exit 0, calls :meth:`Proc.fail` to exit non-zero (the message is what the image
prints before it exits), and is cancelled when its container stops (SIGTERM: clean up in ``finally``).
It acts on the API only through :meth:`Proc.api` (the pod's ServiceAccount), on the node only
through :attr:`Proc.node` and its files through :attr:`Proc.fs` (the container's mounts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from .api import Api
from .node import NodeState
from .podspec import Container, Pod
from .profile import Profile
from .vfs import ContainerFS

if TYPE_CHECKING:
    from .kubelet import PodRunner

T = TypeVar("T")

log = logging.getLogger("emulators")

# In the instant profile a wait that would sleep waits for the next change on the node instead; this
# is the longest it waits without one (things it cannot observe, such as another tool's API write).
CHANGE_FALLBACK_S = 1.0
CHANGE_COALESCE_S = 0.05


class ContainerExit(Exception):
    """The container's main process exited with `code`; `message` is its last output."""

    def __init__(self, code: int, message: str, reason: str = "Error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


class Proc:
    """One run of one container (a restart gets a new Proc and a fresh root filesystem)."""

    def __init__(
        self,
        runner: PodRunner,
        spec: Container,
        env: dict[str, str],
        fs: ContainerFS,
        *,
        resumed: bool = False,
    ) -> None:
        self.runner = runner
        self.spec = spec
        self.env = env
        self.fs = fs
        self.resumed = resumed
        """The container was already running when the emulators (re)started: skip one-time work."""
        self.ready = True
        """Readiness the program reports (its startup/readiness probe); most images are ready once running."""
        self.name = ""
        """The program's executable name (what `ps` shows; config-manager signals by it)."""
        self.signals: asyncio.Queue[str] = asyncio.Queue()
        self.started = asyncio.get_running_loop().time()
        self.sigterm = False
        """The kubelet is stopping this container (pod deleted): the image's SIGTERM handling runs.
        When the emulators themselves stop, containers keep running on the node and nothing is undone."""

    @property
    def pod(self) -> Pod:
        return self.runner.pod

    @property
    def node(self) -> NodeState:
        return self.runner.node

    @property
    def profile(self) -> Profile:
        return self.runner.emu.profile

    @property
    def emu(self) -> Any:
        return self.runner.emu

    def out(self, message: str) -> None:
        """What the image prints (to the emulators' log, prefixed with the pod and container)."""
        log.info("%s/%s: %s", self.pod.key, self.spec.name, message)

    def fail(self, message: str, code: int = 1) -> NoReturn:
        self.out(message)
        raise ContainerExit(code, message)

    async def api(self, agent: str = "") -> Api:
        """The API as this pod's ServiceAccount (a bound token, as the kubelet projects it), with the
        User-Agent of the image's client (`agent`; client-go's default: the binary's name)."""
        if not self.pod.automount_token:
            # rest.InClusterConfig() without the projected token.
            self.fail(
                "unable to load in-cluster configuration: open "
                "/var/run/secrets/kubernetes.io/serviceaccount/token: no such file or directory"
            )
        api: Api = await self.emu.tokens.api_for(self.pod, agent or self.name or self.spec.name)
        return api

    def set_ready(self, ready: bool) -> None:
        if ready != self.ready:
            self.ready = ready
            self.runner.container_changed(self.spec.name)

    async def work(self, operand: str) -> None:
        """Start-up work of the image (compiling a driver, installing the toolkit)."""
        delay = self.profile.startup_delay(operand)
        if delay > 0:
            await asyncio.sleep(delay)

    async def sleep(self, seconds: float) -> None:
        """The image sleeps (a fixed delay, not a wait for something)."""
        delay = self.profile.sleep_time(seconds)
        if delay > 0:
            await asyncio.sleep(delay)

    async def wait_next(self, interval: float) -> None:
        """Between two checks of a polling image: its interval, or (instant) the next node change."""
        delay = self.profile.sleep_time(interval)
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            await self.node.wait_change(CHANGE_FALLBACK_S)
            # A burst of changes (a pod's status writes) wakes the image once, not once per write.
            await asyncio.sleep(CHANGE_COALESCE_S)

    async def poll(
        self, check: Callable[[], Awaitable[T | None]], interval: float, timeout: float | None = None
    ) -> T | None:
        """Call `check` until it returns a value, every `interval` seconds (the image's own period).

        With `timeout` (the image's own, in seconds), give up and return None after it.
        """
        loop = asyncio.get_running_loop()
        # The image's timeout; in the instant profile in real seconds (it only ends a broken wait).
        limit = (
            None
            if timeout is None
            else (self.profile.sleep_time(timeout) if self.profile.sleeps else timeout)
        )
        deadline = None if limit is None else loop.time() + limit
        while True:
            found = await check()
            if found is not None:
                return found
            if deadline is not None and loop.time() >= deadline:
                return None
            await self.wait_next(interval)

    async def forever(self) -> NoReturn:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


Program = Callable[[Proc, tuple[str, ...]], Awaitable[None]]
PROGRAMS: dict[str, Program] = {}


def program(*names: str) -> Callable[[Program], Program]:
    def register(fn: Program) -> Program:
        for name in names:
            PROGRAMS[name] = fn
        return fn

    return register
