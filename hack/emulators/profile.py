"""Timing profiles: how long the emulated images take, and whether their sleeps take time.

Two profiles, chosen with ``SIM_PROFILE`` (hack/cluster.sh passes it on) and scaled by
``SIM_TIME_SCALE`` (every duration is multiplied by it):

``instant`` (the default, for tests)
    No start-up work takes time, and every wait an image does by sleeping (an init container's
    ``sleep 5`` loop, the validator's 5 s retries, the driver manager's 5 s polls) is woken as soon as
    the thing it waits for changes instead of after its interval. Pods still go through every state
    (``Init:0/N`` while a file is missing, ``CrashLoopBackOff`` with back-off), just without delays.

``realistic``
    Start-up work takes what it takes on a real node, with a spread: the driver container builds and
    loads the kernel modules in tens of seconds, the toolkit installs in a few seconds, everything
    else starts in about a second. Sleeps and polls take their real interval, parsed from the pod
    spec where the image reads it from there (``sleep 5`` in an init container's args, probe
    periods). Kubelet back-off is the kubelet's (10 s doubling to 5 min).

``SIM_TIME_SCALE=0.2`` runs the realistic profile five times faster, for benchmarks that should
finish in minutes; the ratios between operands stay those of a real node.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

STARTUP_DEFAULT = "default"


@dataclass(frozen=True)
class Profile:
    name: str
    startup: dict[str, tuple[float, float]]
    """Start-up work per operand key (see :meth:`startup_delay`): (mean, spread) in seconds."""
    sleeps: bool
    """Whether an image's sleeps and poll intervals take time (False: wake on the next change)."""
    backoff_base: float
    backoff_max: float
    probes: bool
    """Whether probe initialDelaySeconds/periodSeconds delay readiness."""
    termination: tuple[float, float]
    """Time from a pod's deletion to its containers having stopped (mean, spread)."""
    scale: float = 1.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def _spread(self, mean: float, spread: float) -> float:
        return max(0.0, self.rng.uniform(mean - spread, mean + spread)) * self.scale

    def startup_delay(self, operand: str) -> float:
        """Seconds of start-up work for an operand (`driver`, `toolkit`, or anything else)."""
        mean, spread = self.startup.get(operand, self.startup[STARTUP_DEFAULT])
        return self._spread(mean, spread)

    def sleep_time(self, seconds: float) -> float:
        """How long an image's `sleep seconds` takes here; 0 means: until the next change."""
        return seconds * self.scale if self.sleeps else 0.0

    def backoff(self, restarts: int) -> float:
        """The kubelet's CrashLoopBackOff delay before restart number `restarts` (1, 2, ...).

        The kubelet keeps one back-off per container (pkg/kubelet/kuberuntime/kuberuntime_manager.go
        doBackOff, client-go util/flowcontrol/backoff.go Next): the first exit waits the base, each
        further one twice the last, up to the maximum (reset only after 2 x maximum without an exit).
        So a container that keeps crashing waits ``base * 2**(n-1)`` before its n-th restart.
        """
        delay = self.backoff_base * 2.0 ** max(0, restarts - 1)
        return min(delay, self.backoff_max) * self.scale

    def probe_delay(self, seconds: float) -> float:
        return seconds * self.scale if self.probes else 0.0

    def termination_delay(self) -> float:
        return self._spread(*self.termination)


def instant(scale: float = 1.0) -> Profile:
    return Profile(
        name="instant",
        startup={STARTUP_DEFAULT: (0.0, 0.0)},
        sleeps=False,
        # A crash loop still backs off (so a failing pod costs little), just faster than a kubelet.
        backoff_base=0.5,
        backoff_max=5.0,
        probes=False,
        termination=(0.0, 0.0),
        scale=scale,
    )


def realistic(scale: float = 1.0) -> Profile:
    return Profile(
        name="realistic",
        startup={
            # Driver container: compile (or unpack precompiled) and load the kernel modules.
            "driver": (45.0, 15.0),
            # Toolkit: copy the runtime binaries, write the containerd drop-in, signal containerd.
            "toolkit": (4.0, 1.5),
            # mig-manager: a MIG mode change resets the GPUs; creating the instances takes seconds too.
            "mig": (10.0, 4.0),
            STARTUP_DEFAULT: (1.0, 0.5),
        },
        sleeps=True,
        # kubelet: pkg/kubelet/kubelet.go (backOffPeriod 10 s, MaxContainerBackOff 300 s).
        backoff_base=10.0,
        backoff_max=300.0,
        probes=True,
        termination=(1.0, 0.5),
        scale=scale,
    )


PROFILES = {"instant": instant, "realistic": realistic}


def profile(name: str, scale: float = 1.0) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"SIM_PROFILE must be one of {sorted(PROFILES)}, not {name!r}")
    if scale <= 0:
        raise ValueError(f"SIM_TIME_SCALE must be > 0, not {scale}")
    return PROFILES[name](scale)
