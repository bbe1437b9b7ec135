"""The kubelet of operand pods: sandbox, init containers, containers, restarts, probes, termination.

kwok's Stages no longer touch the operand pods (ours, labelled
``app.kubernetes.io/managed-by=gpu-operator``, and NVIDIA's operator's: :func:`.podspec.emulated`); a
:class:`PodRunner` runs each of them on its emulated node the way a kubelet does and writes the pod
status through the ``pods/status`` subresource:

1. **Sandbox.** Volumes must be mountable (a missing, non-optional ConfigMap keeps the pod in
   ``ContainerCreating``/``Init:0/N`` with a ``FailedMount`` event) and the RuntimeClass's handler
   must be configured in the node's containerd (else ``FailedCreatePodSandBox``: *no runtime for
   "nvidia" is configured*), retried until they are.
2. **Init containers** one after the other, each to exit 0; a failing one is restarted with the
   kubelet's back-off (``Init:CrashLoopBackOff``). Native sidecars (restartPolicy Always) start and
   keep running.
3. **Containers** all together, restarted with back-off whenever they exit (``CrashLoopBackOff``).
   Env from a missing ConfigMap is ``CreateContainerConfigError``; a command the image does not
   have is a ``StartError`` (exit 128, containerd's message). Ready when the program says so, after
   the probes' initial delay in the realistic profile.
4. **Termination**: on deletion, preStop hooks run (``rm -f /run/nvidia/validations/*-ready``), the
   programs get SIGTERM (cancelled), and after the grace the pod object is deleted (grace 0), as the
   kubelet's status manager does.

What a container runs is decided in :meth:`PodRunner.execute` from its command, args and image
(:mod:`.shell`, :mod:`.images`); what a known program does is in the operand modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import images, shell
from .node import NodeState
from .podspec import Container, EnvVar, Pod
from .process import PROGRAMS, ContainerExit, Proc
from .vfs import ContainerFS

if TYPE_CHECKING:
    from .emulator import Emulator

log = logging.getLogger("emulators")

JSON = dict[str, Any]
PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin", "/busybox", "/work")
SANDBOX_RETRY_S = 10.0
"""The kubelet's pod sync period for a pod whose sandbox or volumes failed."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Failure:
    """An injected failure (tests/e2e/kube_helpers.py inject_failure, read from its kwok Stage)."""

    reason: str
    """CrashLoopBackOff or ImagePullBackOff."""
    container: str = ""
    """Only this container ('' = every container)."""
    restarts: int = 0
    """CrashLoopBackOff: the restartCount the failing containers start at, as on a pod that has been
    crash-looping that long (its back-off goes on from there, see :meth:`PodRunner._back_off`)."""


@dataclass
class ContainerState:
    name: str
    image: str
    init: bool
    sidecar: bool = False
    restarts: int = 0
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "PodInitializing"}})
    last: JSON | None = None
    ready: bool = False
    started: bool = False
    container_id: str = ""

    def as_status(self) -> JSON:
        status: JSON = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restarts,
            "started": self.started,
            "state": self.state,
            "lastState": {"terminated": self.last} if self.last else {},
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def render_status(
    states: list[ContainerState],
    *,
    sandbox: bool,
    host_ip: str,
    pod_ip: str,
    start_time: str,
    transitions: dict[str, str],
    restart_policy: str = "Always",
) -> JSON:
    """The pod status a kubelet reports for these container states (pure)."""
    inits = [s for s in states if s.init]
    mains = [s for s in states if not s.init]
    incomplete = [s.name for s in inits if not _init_done(s)]
    unready = [s.name for s in mains if not s.ready]
    initialized = not incomplete
    running = initialized and any("running" in s.state for s in mains)
    phase = "Running" if running else "Pending"
    ended = [s.state["terminated"] for s in mains if "terminated" in s.state]
    completed = restart_policy != "Always" and initialized and bool(mains) and len(ended) == len(mains)
    if completed:
        phase = "Succeeded" if all(t.get("exitCode") == 0 for t in ended) else "Failed"

    def condition(kind: str, ok: bool, reason: str = "", message: str = "") -> JSON:
        key = f"{kind}={ok}"
        transitions.setdefault(key, now())
        body: JSON = {
            "type": kind,
            "status": "True" if ok else "False",
            "lastTransitionTime": transitions[key],
        }
        if not ok and reason:
            body["reason"] = reason
        if not ok and message:
            body["message"] = message
        return body

    # A pod whose containers have all ended is not ready, for that reason (kubelet's PodCompleted).
    unready_reason = "PodCompleted" if completed else "ContainersNotReady"
    unready_message = "" if completed else f"containers with unready status: [{' '.join(unready)}]"

    conditions = [
        condition("PodReadyToStartContainers", sandbox),
        condition(
            "Initialized",
            initialized,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(incomplete)}]",
        ),
        condition("ContainersReady", initialized and not unready, unready_reason, unready_message),
        condition("Ready", initialized and not unready, unready_reason, unready_message),
    ]  # fmt: skip
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": [s.as_status() for s in mains],
        "startTime": start_time,
    }
    if inits:
        status["initContainerStatuses"] = [s.as_status() for s in inits]
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    if pod_ip and sandbox:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


def _init_done(state: ContainerState) -> bool:
    """An init container has exited 0; a native sidecar counts once it has started."""
    terminated = state.state.get("terminated")
    if terminated is not None:
        return bool(terminated.get("exitCode") == 0)
    return state.sidecar and state.started and "running" in state.state


class PodRunner:
    def __init__(self, emu: Emulator, pod: Pod, node: NodeState, body: Mapping[str, Any]) -> None:
        self.emu = emu
        self.pod = pod
        self.node = node
        self.states = {
            c.name: ContainerState(c.name, c.image, init=c in pod.init_containers, sidecar=c.sidecar)
            for c in pod.all_containers()
        }
        for c in pod.containers:
            if not pod.init_containers:
                self.states[c.name].state = {"waiting": {"reason": "ContainerCreating"}}
        self.procs: dict[str, Proc] = {}
        self.empty_dirs: dict[str, dict[str, Any]] = {}
        self.sandbox = False
        self.start_time = (body.get("status") or {}).get("startTime") or now()
        self.transitions: dict[str, str] = {}
        self.pod_ip = (
            "" if pod.host_network else emu.ips.allocate(pod.uid, (body.get("status") or {}).get("podIP", ""))
        )
        self.failures: list[Failure] = emu.failures_for(pod)
        for c in pod.containers:
            failure = self._failure(c)
            if failure and failure.reason == "CrashLoopBackOff":
                self.states[c.name].restarts = failure.restarts
        self.task: asyncio.Task[None] | None = None
        self.sidecars: list[asyncio.Task[None]] = []
        self.terminating = False
        self._events: set[tuple[str, str]] = set()
        self._adopt(body)

    # --- adoption after an emulator restart ------------------------------------------------------

    def _adopt(self, body: Mapping[str, Any]) -> None:
        """Keep restart counts, and treat a Ready pod's containers as running (kubelet restart)."""
        status = body.get("status") or {}
        for item in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            state = self.states.get(item.get("name", ""))
            if state is not None:
                state.restarts = int(item.get("restartCount") or 0)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        self.adopted = ready
        self.finished = status.get("phase") in ("Succeeded", "Failed")
        """A pod that ran to its end (restartPolicy OnFailure or Never) stays as it ended."""
        if self.finished:
            self.sandbox = True
            for item in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
                state = self.states.get(item.get("name", ""))
                if state is not None:
                    state.state = dict(item.get("state") or {})
                    state.ready = bool(item.get("ready"))
        for key in ("Initialized", "Ready", "ContainersReady", "PodReadyToStartContainers"):
            for c in status.get("conditions") or []:
                if c.get("type") == key:
                    self.transitions[f"{key}={c.get('status') == 'True'}"] = (
                        c.get("lastTransitionTime") or now()
                    )

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pod {self.pod.key}")

    async def _run(self) -> None:
        if self.finished:
            return
        try:
            await self._sandbox()
            if self.adopted:
                await self._resume()
                return
            for spec in self.pod.init_containers:
                if spec.sidecar:
                    self._start_sidecar(spec)
                else:
                    await self._run_to_end(spec)
            if self.pod.restart_policy == "Always":
                await asyncio.gather(*(self._keep_running(spec) for spec in self.pod.containers))
            else:
                await asyncio.gather(*(self._run_to_end(spec) for spec in self.pod.containers))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s: emulation failed", self.pod.key)

    async def _resume(self) -> None:
        for spec in self.pod.init_containers:
            state = self.states[spec.name]
            state.state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": self.start_time,
                                          "finishedAt": self.start_time}}  # fmt: skip
        await asyncio.gather(*(self._keep_running(spec, resumed=True) for spec in self.pod.containers))

    def _start_sidecar(self, spec: Container) -> None:
        self.sidecars.append(
            asyncio.create_task(self._keep_running(spec), name=f"sidecar {self.pod.key}/{spec.name}")
        )

    async def _sandbox(self) -> None:
        """Mount the volumes and create the sandbox, retrying (kubelet pod sync) until both work."""
        self.changed()
        while True:
            problem = self._volume_problem() or self._runtime_problem()
            if problem is None:
                break
            reason, message = problem
            self.event("Warning", reason, message)
            await self.retry_wait(SANDBOX_RETRY_S)
        self.sandbox = True
        self.changed()

    def _volume_problem(self) -> tuple[str, str] | None:
        used = {m.volume for c in self.pod.all_containers() for m in c.mounts}
        for name in sorted(used):
            volume = self.pod.volumes.get(name)
            if volume is None:
                continue
            if volume.kind == "configMap" and not volume.optional:
                data = self.emu.config_map(self.pod.namespace, volume.source)
                if data is None:
                    return (
                        "FailedMount",
                        f'MountVolume.SetUp failed for volume "{name}" : configmap "{volume.source}" not '
                        "found",
                    )
                missing = [k for k, _ in volume.items if k not in data]
                if missing:
                    return (
                        "FailedMount",
                        f'MountVolume.SetUp failed for volume "{name}" : configmap references non-existent '
                        f"config key: {missing[0]}",
                    )
            if volume.kind == "hostPath" and volume.host_type in ("Directory", "File", "Socket"):
                exists = (
                    self.node.is_dir(volume.source)
                    if volume.host_type == "Directory"
                    else self.node.read(volume.source) is not None
                )
                if not exists:
                    kind = {"Directory": "a directory", "File": "a file", "Socket": "a socket"}[
                        volume.host_type
                    ]
                    return (
                        "FailedMount",
                        f'MountVolume.SetUp failed for volume "{name}" : hostPath type check failed: '
                        f"{volume.source} is not {kind}",
                    )
        return None  # fmt: skip

    def _runtime_problem(self) -> tuple[str, str] | None:
        if not self.pod.runtime_class:
            return None
        handler = self.emu.runtime_handler(self.pod.runtime_class)
        if handler is None:
            return (
                "FailedCreatePodSandBox",
                "Failed to create pod sandbox: "
                f'runtimeclass.node.k8s.io "{self.pod.runtime_class}" not found',
            )
        if handler not in self.node.runtime_handlers:
            return (
                "FailedCreatePodSandBox",
                "Failed to create pod sandbox: rpc error: code = Unknown desc = "
                f'failed to get sandbox runtime: no runtime for "{handler}" is configured',
            )
        return None  # fmt: skip

    async def retry_wait(self, interval: float) -> None:
        delay = self.emu.profile.sleep_time(interval)
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            await self.node.wait_change(1.0)

    async def _run_to_end(self, spec: Container) -> None:
        """An init container, or a container of a pod that is not restarted once it succeeds: run it
        until it exits 0 (restarted with back-off), or once with restartPolicy Never."""
        state = self.states[spec.name]
        once = self.pod.restart_policy == "Never" and not state.init
        while True:
            code, reason, message = await self._run_once(spec)
            if code == 0 or once:
                state.state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": now(),
                                              "finishedAt": now()}}  # fmt: skip
                if message and code:
                    state.state["terminated"]["message"] = message[-1024:]
                # A completed init container is reported ready; an ended app container is not.
                state.ready = state.init and code == 0
                state.started = False
                self.changed()
                return
            await self._back_off(spec, code, reason, message)

    async def _keep_running(self, spec: Container, resumed: bool = False) -> None:
        while True:
            code, reason, message = await self._run_once(spec, resumed=resumed)
            resumed = False
            await self._back_off(spec, code, reason, message)

    async def _back_off(self, spec: Container, code: int, reason: str, message: str) -> None:
        state = self.states[spec.name]
        finished = now()
        state.last = {"exitCode": code, "reason": reason, "message": message[-1024:], "startedAt": finished,
                      "finishedAt": finished, "containerID": state.container_id}  # fmt: skip
        state.restarts += 1
        state.ready = False
        state.started = False
        # The kubelet's back-off grows with every restart of the container, whatever its count
        # started at (an injected failure's), so it is the one for this restart number.
        delay = self.emu.profile.backoff(state.restarts)
        state.state = {"waiting": {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {_seconds(delay)} restarting failed container={spec.name} "
                       f"pod={self.pod.name}_{self.pod.namespace}({self.pod.uid})",
        }}  # fmt: skip
        self.event("Warning", "BackOff", "Back-off restarting failed container " + spec.name)
        self.changed()
        await asyncio.sleep(delay)

    def _failure(self, spec: Container) -> Failure | None:
        for failure in self.failures:
            if failure.container in ("", spec.name) and (failure.container or spec in self.pod.containers):
                return failure
        return None

    async def _run_once(self, spec: Container, resumed: bool = False) -> tuple[int, str, str]:
        """Create and start the container, run it until it exits: (exit code, reason, message)."""
        state = self.states[spec.name]
        failure = self._failure(spec)
        if failure and failure.reason == "ImagePullBackOff":
            state.state = {
                "waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{spec.image}"'}
            }
            self.event("Warning", "Failed", "Error: ImagePullBackOff")
            self.changed()
            await asyncio.Event().wait()
        while True:
            try:
                env = self.resolve_env(spec)
                break
            except ConfigError as exc:
                state.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                self.event("Warning", "Failed", f"Error: {exc}")
                self.changed()
                await self.retry_wait(SANDBOX_RETRY_S)
        fs = ContainerFS(
            self.pod, spec, self.node, self.empty_dirs, self.emu.config_map, images.files(spec.image)
        )
        proc = Proc(self, spec, env, fs, resumed=resumed)
        # A stable, unique-looking ID per container run (pod UID, container name, restart number).
        uid = self.pod.uid.replace("-", "")[:24]
        state.container_id = f"containerd://{uid}{spec.name.encode().hex()[:16]}{state.restarts:08x}"
        started = now()
        state.state = {"running": {"startedAt": started}}
        state.started = spec.startup_probe is None
        self.procs[spec.name] = proc
        # After the program's first step, so one that reports "not ready yet" never flaps to Ready.
        asyncio.get_running_loop().call_soon(self.container_changed, spec.name)
        try:
            if failure and failure.reason == "CrashLoopBackOff":
                return 1, "Error", "injected failure (gpu-operator.sim/failure)"
            await self.execute(proc, self.argv(spec), top=True)
            return 0, "Completed", ""
        except ContainerExit as exc:
            return exc.code, exc.reason, exc.message
        except _ScriptExit:
            return 0, "Completed", ""
        except Exception as exc:
            # The program died of something it did not handle (a request the loaded API server dropped:
            # aiohttp's ServerDisconnectedError, a reset connection): like a Go image exiting on the
            # error, the container exits 1 and the kubelet restarts it with its back-off. Before, the
            # pod's emulation ended there and the pod stayed in its init container for good.
            log.warning("pod %s: container %s failed: %r", self.pod.key, spec.name, exc)
            return 1, "Error", f"{type(exc).__name__}: {exc}"
        finally:
            self.procs.pop(spec.name, None)

    @staticmethod
    def argv(spec: Container) -> tuple[str, ...]:
        if spec.command:
            return spec.command + spec.args
        entry = images.entrypoint(spec.image)
        return (entry[:1] + spec.args) if spec.args else entry

    def container_changed(self, name: str) -> None:
        """A program's readiness changed: apply the probes' initial delay, then report it."""
        proc = self.procs.get(name)
        state = self.states.get(name)
        if state is None or state.init:
            self.changed()
            return
        if not (proc and proc.ready and "running" in state.state):
            state.ready = False
            self.changed()
            return
        probe = proc.spec.startup_probe or proc.spec.readiness_probe
        loop = asyncio.get_running_loop()
        # The first probe runs initialDelaySeconds after the container started.
        delay = (
            proc.started + self.emu.profile.probe_delay(probe.initial_delay) - loop.time() if probe else 0.0
        )

        def mark() -> None:
            current = self.procs.get(name)
            if current is proc and proc is not None and proc.ready:
                state.ready = True
                state.started = True
                self.changed()

        if delay > 0:
            loop.call_later(delay, mark)
        else:
            mark()

    # --- running what the container runs --------------------------------------------------------

    def resolve_env(self, spec: Container) -> dict[str, str]:
        env: dict[str, str] = images.env(spec.image)
        for kind, name, optional in spec.env_from:
            if kind == "configMap":
                data = self.emu.config_map(self.pod.namespace, name)
                if data is None and not optional:
                    raise ConfigError(f'configmap "{name}" not found')
                env.update(data or {})
        for var in spec.env:
            value = self._env_value(var, env)
            if value is not None:
                env[var.name] = value
        return env

    def _env_value(self, var: EnvVar, env: Mapping[str, str]) -> str | None:
        if var.field_path is not None:
            fields = {
                "spec.nodeName": self.pod.node,
                "metadata.namespace": self.pod.namespace,
                "metadata.name": self.pod.name,
                "metadata.uid": self.pod.uid,
                "status.hostIP": self.node.host_ip,
                "status.podIP": self.pod_ip or self.node.host_ip,
                "spec.serviceAccountName": self.pod.service_account,
            }
            return fields.get(var.field_path, "")
        if var.config_map is not None:
            name, key, optional = var.config_map
            data = self.emu.config_map(self.pod.namespace, name)
            if data is None or key not in data:
                if optional:
                    return None
                if data is None:
                    raise ConfigError(f'configmap "{name}" not found')
                raise ConfigError(f"couldn't find key {key} in ConfigMap {self.pod.namespace}/{name}")
            return data[key]
        if var.secret is not None:
            return ""
        # $(VAR) references to earlier variables, as the kubelet expands them.
        value = var.value or ""
        for name, known in env.items():
            value = value.replace(f"$({name})", known)
        return value

    def _lookup(self, fs: ContainerFS, command: str) -> str | None:
        if "/" in command:
            return command if fs.exists(command) else None
        for folder in PATH:
            candidate = posixpath.join(folder, command)
            if fs.exists(candidate):
                return candidate
        return None

    async def execute(self, proc: Proc, argv: tuple[str, ...], *, top: bool = False) -> None:
        """Run argv in the container: a shell script's steps, or an emulated program."""
        if not argv:
            proc.fail("no command specified", code=128)
        found = self._lookup(proc.fs, argv[0])
        if found is None:
            if top:
                what = "no such file or directory" if "/" in argv[0] else "executable file not found in $PATH"
                where = f"stat {argv[0]}: " if "/" in argv[0] else ""
                raise ContainerExit(
                    128,
                    "failed to create containerd task: failed to create shim task: OCI runtime create "
                    "failed: "
                    "runc create failed: unable to start container process: error during container init: "
                    f'exec: "{argv[0]}": {where}{what}: unknown',
                    "StartError",
                )
            proc.fail(f"sh: {argv[0]}: not found", code=127)
        scripted = shell.shell_script(argv)
        if scripted is not None:
            await self._run_script(proc, argv[0], *scripted)
            return
        name = posixpath.basename(argv[0])
        content = proc.fs.read(found)
        if content and content.startswith("#!"):
            # A script run directly: the kernel runs its interpreter.
            interpreter = shell.parse(content).interpreter
            if not interpreter or self._lookup(proc.fs, interpreter) is None:
                proc.fail(f"exec {argv[0]}: no such file or directory", code=127 if not top else 128)
            await self._run_script(proc, interpreter, "content", content)
            return
        proc.name = name
        program = PROGRAMS.get(name)
        if program is None:
            # An executable the emulators do not model: a daemon that just runs (as kwok's pods do).
            await proc.forever()
        await program(proc, argv)

    async def _run_script(self, proc: Proc, sh: str, kind: str, text: str) -> None:
        if kind in ("file", "exec-file"):
            content = proc.fs.read(text)
            if content is None:
                proc.fail(f"sh: {text}: not found" if kind == "exec-file" else f"sh: can't open '{text}': "
                                                                               "No such file or directory",
                          code=127 if kind == "exec-file" else 2)  # fmt: skip
            if kind == "exec-file":
                interpreter = shell.parse(content).interpreter
                if interpreter and self._lookup(proc.fs, interpreter) is None:
                    # busybox sh execs the file; the kernel cannot find its interpreter.
                    proc.fail(f"{sh}: {text}: not found", code=127)
            text = content
        script = shell.parse(text, proc.env)
        for step in script.steps:
            await self._step(proc, step)

    async def _step(self, proc: Proc, step: shell.Step) -> None:
        if step.kind == "wait":

            async def present() -> bool | None:
                return True if proc.fs.exists(step.path) else None

            proc.out(f"waiting for {step.path}")
            await proc.poll(present, step.seconds)
        elif step.kind == "source":
            content = proc.fs.read(step.path)
            if content is None:
                proc.fail(f"sh: .: can't open '{step.path}': No such file or directory", code=2)
            for line in content.splitlines():
                name, sep, value = line.partition("=")
                if sep and name.strip().isidentifier():
                    proc.env[name.strip()] = value.strip().strip('"')
        elif step.kind == "env":
            proc.env[step.name] = step.value
        elif step.kind == "sleep":
            await proc.sleep(step.seconds)
        elif step.kind == "forever":
            await proc.forever()
        elif step.kind == "remove":
            for pattern in step.argv:
                proc.fs.remove_glob(pattern)
        elif step.kind == "touch":
            for path in step.argv:
                if proc.fs.read(path) is None and not proc.fs.write(path, ""):
                    proc.fail(f"touch: {path}: Read-only file system")
        elif step.kind == "exit":
            if step.code:
                proc.fail(f"exit {step.code}", code=step.code)
            raise _ScriptExit
        elif step.kind == "if":
            # `$(cat FILE)`: the content without its trailing newlines ("" when it cannot be read).
            content = (proc.fs.read(step.path) or "").rstrip("\n")
            if (content != step.value) == (step.name == "!="):
                for inner in step.body:
                    await self._step(proc, inner)
        elif step.kind == "run":
            await self.execute(proc, step.argv)

    # --- termination ----------------------------------------------------------------------------

    async def terminate(self) -> None:
        """The pod was deleted: preStop hooks, SIGTERM, then remove the pod object (grace 0)."""
        if self.terminating:
            return
        self.terminating = True
        for proc in list(self.procs.values()):
            proc.sigterm = True
        for proc in list(self.procs.values()):
            if proc.spec.pre_stop:
                with contextlib.suppress(ContainerExit, _ScriptExit):
                    await self.execute(proc, proc.spec.pre_stop)
        for task in self.tasks():
            task.cancel()
        await asyncio.gather(*self.tasks(), return_exceptions=True)
        delay = self.emu.profile.termination_delay()
        if delay > 0:
            await asyncio.sleep(delay)
        self.emu.ips.release(self.pod.uid)
        await self.emu.delete_pod(self.pod)

    def stop(self) -> None:
        """Forget the pod without touching the API (it is gone already)."""
        self.terminating = True
        for task in self.tasks():
            task.cancel()
        self.emu.ips.release(self.pod.uid)

    def tasks(self) -> list[asyncio.Task[None]]:
        return ([self.task] if self.task is not None else []) + self.sidecars

    # --- reporting ------------------------------------------------------------------------------

    def changed(self) -> None:
        if not self.terminating:
            self.emu.status_changed(self)

    def status(self) -> JSON:
        return render_status(
            list(self.states.values()),
            sandbox=self.sandbox,
            host_ip=self.node.host_ip,
            pod_ip=self.pod_ip or (self.node.host_ip if self.pod.host_network else ""),
            start_time=self.start_time,
            transitions=self.transitions,
            restart_policy=self.pod.restart_policy,
        )

    def event(self, kind: str, reason: str, message: str) -> None:
        """Post an Event once per (reason, message), as a kubelet's event aggregation shows it."""
        if (reason, message) in self._events:
            return
        self._events.add((reason, message))
        self.emu.post_event(self.pod, kind, reason, message)


class ConfigError(Exception):
    """CreateContainerConfigError: the container's config references something missing."""


class _ScriptExit(Exception):
    """`exit 0` in a script."""


def _seconds(delay: float) -> str:
    whole = int(delay)
    return (
        f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{max(whole, 0)}s" if whole else f"{delay:.1f}s"
    )
