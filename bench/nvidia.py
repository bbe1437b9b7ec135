"""NVIDIA's own operator on the bench's cluster (`python -m bench.run --side-by-side`): its build, its CRDs
and RBAC, and its process, run out of cluster like ours (bench/cluster.py OperatorProcess).

What it needs there, from its source at the tag hack/versions.env names (NVIDIA_OPERATOR_VERSION):

* the binary, its states (`assets/`) and manifests, and its chart: `make nvidia-operator`
  (hack/build-nvidia-operator.sh), kept in .cache/tools/nvidia-gpu-operator-<version>-<hash>/;
* its states read from the fixed path /opt/gpu-operator (controllers/state_manager.go:798-818,
  internal/state/manager.go:126-144; no flag or variable moves it): the process runs in its own mount
  namespace (`unshare`) with the build's `opt/` mounted on /opt, as its image has it
  (docker/Dockerfile:128-136); the binary is unchanged and nothing outside the process sees the mount;
* OPERATOR_NAMESPACE, without which it exits (cmd/gpu-operator/main.go:116-124);
* the images of the operands the policy names none for, which its chart's ClusterPolicy fills in and
  which it otherwise reads from the environment (api/nvidia/v1/clusterpolicy_types.go:2054-2086, the
  variable of each operand at 2089-2154; the OLM way): the defaults our operator uses, so both deploy
  the same images;
* its CRDs, all of deployments/gpu-operator/crds (its controllers watch ClusterPolicies, NVIDIADrivers
  and GPUClusters: controllers/nodelabeling_controller.go:644-673), and its chart's ServiceAccount,
  Role, ClusterRole and bindings, rendered by `helm template` from the same tag. The ServiceAccount is
  `gpu-operator` in the release namespace (templates/serviceaccount.yaml), the very name ours has, so the
  bench logs in and reads the audit log for both the same way.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster import NAMESPACE, ROOT, OperatorProcess
from bench.kubeapi import Objects
from gpu_operator.core.components import (
    COMPONENTS,
    DRIVER_MANAGER,
    DRIVER_MANAGER_ENV,
    GDRCOPY,
    GDRCOPY_ENV,
    GDS,
    GDS_ENV,
    Image,
)

BUILD_SCRIPT = ROOT / "hack" / "build-nvidia-operator.sh"
# The controller whose reconciles are its passes (controllers/clusterpolicy_controller.go:450).
CONTROLLER = "clusterpolicy-controller"
# What must be established before it starts: its watches fail without them (see the module's doc).
CRD_NAMES = ("clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com")
RBAC_TEMPLATES = ("serviceaccount", "role", "rolebinding", "clusterrole", "clusterrolebinding")
# Mounts the build's opt/ on /opt in the new mount namespace, then becomes the operator (same pid).
MOUNT_AND_EXEC = 'mount --bind "$1" /opt && shift && exec "$@"'


@dataclass(frozen=True)
class Build:
    """hack/build-nvidia-operator.sh's output directory."""

    dir: Path

    @property
    def binary(self) -> Path:
        return self.dir / "bin" / "gpu-operator"

    @property
    def opt(self) -> Path:
        """Mounted on /opt: holds gpu-operator/ (assets, manifests, CRDs) as the image's /opt does."""
        return self.dir / "opt"

    @property
    def chart(self) -> Path:
        return self.dir / "chart" / "gpu-operator"

    @property
    def crds(self) -> list[Path]:
        return sorted((self.chart / "crds").glob("*.yaml"))


REQUIRED_SECTIONS = (
    "daemonsets", "dcgm", "dcgmExporter", "devicePlugin", "driver", "gfd", "nodeStatusExporter", "operator",
    "toolkit",
)  # fmt: skip
"""The spec fields NVIDIA's CRD requires (api/nvidia/v1/clusterpolicy_types.go:47-63: no omitempty); the
seed sample leaves some out, which ours reads as their defaults."""


def with_required_sections(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy as NVIDIA's API server accepts it: each required section at least empty, which its
    CRD's defaults fill as ours fills an absent one (its chart always renders them all)."""
    spec = policy.setdefault("spec", {})
    for name in REQUIRED_SECTIONS:
        spec.setdefault(name, {})
    return policy


def build() -> Build:
    """The finished build for the pinned version; `make nvidia-operator` makes it (never while timing)."""
    out = subprocess.run([str(BUILD_SCRIPT), "dir"], capture_output=True, text=True, check=True)
    found = Build(Path(out.stdout.strip()))
    if not (found.dir / ".complete").exists():
        raise RuntimeError(f"NVIDIA's operator is not built ({found.dir}): run `make nvidia-operator` first")
    return found


def _reference(image: Image) -> str:
    return f"{image.repository}/{image.name}:{image.version}"


def image_environment() -> dict[str, str]:
    """Variable → image, for every image our operator falls back to when the policy names none: what
    NVIDIA's reads in that case (clusterpolicy_types.go:2079, `imagePath`). Its chart sets two of them
    itself (DRIVER_MANAGER_IMAGE, VALIDATOR_IMAGE: templates/operator.yaml:60-63)."""
    found = {c.image_env: _reference(c.default_image) for c in COMPONENTS}
    for variable, image in ((DRIVER_MANAGER_ENV, DRIVER_MANAGER), (GDS_ENV, GDS), (GDRCOPY_ENV, GDRCOPY)):
        found[variable] = _reference(image)
    return found


def environment(base: Mapping[str, str], namespace: str = NAMESPACE) -> dict[str, str]:
    """The process's environment: `base` without image variables or a kubeconfig of its own (the command
    line names it), with the namespace and the default images."""
    environ = {k: v for k, v in base.items() if not k.endswith("_IMAGE") and k != "KUBECONFIG"}
    environ.update(image_environment())
    environ["OPERATOR_NAMESPACE"] = namespace
    return environ


def command(build: Build, kubeconfig: Path, probe_port: int, metrics_port: int) -> list[str]:
    """Its command line: in a mount namespace of its own (`--map-root-user` lets an unprivileged user
    mount there; as root it maps root to itself), on loopback ports that collide with nothing of the
    bench's cluster (hack/bench.mk: the cluster from port base +247, ours on +90)."""
    return [
        "unshare",
        "--map-root-user",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        MOUNT_AND_EXEC,
        "nvidia-gpu-operator",
        str(build.opt),
        str(build.binary),
        # controller-runtime's flag (vendor/sigs.k8s.io/controller-runtime/pkg/client/config/config.go:56).
        f"--kubeconfig={kubeconfig}",
        # One process, no Lease (the default; cmd/gpu-operator/main.go:85; the chart passes
        # --leader-elect, templates/operator.yaml:42, for its replicas).
        "--leader-elect=false",
        # main.go:83-84: ":8081" and ":8080" on every interface by default.
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
    ]


def rbac_command(helm: Path, chart: Path, namespace: str = NAMESPACE) -> list[str]:
    """`helm template` of the chart's ServiceAccount, Roles and bindings only (no operator Deployment,
    no ClusterPolicy, no NFD: the simulated nodes carry NFD's labels already)."""
    cmd = [str(helm), "template", "gpu-operator", str(chart), "--namespace", namespace]
    for name in RBAC_TEMPLATES:
        cmd += ["--show-only", f"templates/{name}.yaml"]
    return cmd


_RECONCILE = re.compile(r"^controller_runtime_reconcile_total\{([^}]*)\}\s+([0-9.e+]+)\s*$", re.MULTILINE)


def reconciles(metrics: str, controller: str = CONTROLLER) -> int:
    """The reconciles `controller` has run, whatever their result, from controller-runtime's metrics
    (vendor/sigs.k8s.io/controller-runtime/pkg/internal/controller/metrics/metrics.go:32-33)."""
    total = 0.0
    for labels, value in _RECONCILE.findall(metrics):
        if f'controller="{controller}"' in labels.split(","):
            total += float(value)
    return int(total)


def policy_ready(name: str) -> Callable[[Objects], bool]:
    """Its own verdict: `status.state=ready` (it has no observedGeneration and no node count,
    api/nvidia/v1/clusterpolicy_types.go:2012-2020)."""

    def check(objects: Objects) -> bool:
        body = objects.get(f"/{name}")
        return body is not None and (body.get("status") or {}).get("state") == "ready"

    return check


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), ""
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return 0, ""


class NvidiaProcess(OperatorProcess):
    """NVIDIA's operator as its own process; `probe` answers in the shape of ours (passes only)."""

    def __init__(
        self, build: Build, kubeconfig: Path, log_path: Path, probe_port: int, metrics_port: int
    ) -> None:
        super().__init__(kubeconfig, log_path, probe_port)
        self.build = build
        self.metrics_port = metrics_port

    def start(self) -> NvidiaProcess:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                command(self.build, self.kubeconfig, self.probe_port, self.metrics_port),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment(os.environ),
                cwd=ROOT,
            )
        self.started_at = time.time()
        return self

    def up(self) -> bool:
        """Its manager answers /readyz (caches synced, controllers started: main.go:251)."""
        return _get(f"http://127.0.0.1:{self.probe_port}/readyz")[0] == 200

    def probe(self) -> dict[str, Any]:
        code, text = _get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        return {"reconcile": {"passes": reconciles(text)}} if code == 200 else {}
