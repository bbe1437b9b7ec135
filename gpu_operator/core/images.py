"""Image references: NVIDIA's resolution rules (policy triple, then operator env var, then built-in
default) and the OS suffix of driver tags."""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpu_operator.api.common import ComponentSpec
from gpu_operator.core.components import Image

OS_ID_LABEL = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION_LABEL = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
KERNEL_LABEL = "feature.node.kubernetes.io/kernel-version.full"

# RHEL-like distributions tag their images with the major version only (NVIDIA's resolveDriverTag).
_MAJOR_ONLY = {"rhel", "rocky", "ol", "centos", "almalinux"}


def os_name(labels: Mapping[str, str], os_image: str = "") -> str | None:
    """`ubuntu22.04`, `rhel9.4`, ...: os-release's ID and VERSION_ID as they are, from a node's NFD
    labels, else from the kubelet's `osImage` (`status.nodeInfo.osImage`, e.g. "Ubuntu 22.04.4 LTS");
    None when neither says. NVIDIA names a precompiled driver's DaemonSet after it (getKernelVersionsMap)."""
    os_id = labels.get(OS_ID_LABEL)
    version = labels.get(OS_VERSION_LABEL)
    if not os_id or not version:
        found = os_release_of(os_image)
        if found is None:
            return None
        os_id, version = found
    return f"{os_id}{version}"


def tag_of(name: str) -> str:
    """A driver image's OS suffix for an os_name: RHEL-like distributions tag with the major version
    only (`rhel9.4` → `rhel9`, NVIDIA's getGPUNodeOSInfo), the others with the whole version."""
    match = re.fullmatch(r"(.*?)(\d[\w.]*)", name)
    if match and match.group(1) in _MAJOR_ONLY:
        return match.group(1) + match.group(2).split(".")[0]
    return name


def os_tag(labels: Mapping[str, str], os_image: str = "") -> str | None:
    """`ubuntu22.04`, `rhel9`, ...: the driver image's OS suffix for a node (os_name, then tag_of)."""
    name = os_name(labels, os_image)
    return None if name is None else tag_of(name)


# The kubelet's osImage is /etc/os-release's PRETTY_NAME; these are the ones NVIDIA ships driver
# images for, mapped back to os-release's ID and VERSION_ID (what NFD's labels carry). Without NFD
# (the chart's node agent sets only PCI labels) this is what keeps the driver image tag right.
_OS_IMAGES = (
    (re.compile(r"^Ubuntu (\d+\.\d+)"), "ubuntu"),
    (re.compile(r"^Debian GNU/Linux (\d+)"), "debian"),
    (re.compile(r"^Red Hat Enterprise Linux (\d+(?:\.\d+)?) "), "rhel"),
    (re.compile(r"^Rocky Linux (\d+(?:\.\d+)?)"), "rocky"),
    (re.compile(r"^Oracle Linux Server (\d+(?:\.\d+)?)"), "ol"),
    (re.compile(r"^AlmaLinux (\d+(?:\.\d+)?)"), "almalinux"),
    (re.compile(r"^CentOS Stream (\d+)"), "centos"),
    (re.compile(r"^Amazon Linux (\d+)"), "amzn"),
)
_SLES = re.compile(r"^SUSE Linux Enterprise Server (\d+)(?: SP(\d+))?")


def os_release_of(os_image: str) -> tuple[str, str] | None:
    """(os-release ID, VERSION_ID) from a kubelet osImage, for the distributions above."""
    for pattern, os_id in _OS_IMAGES:
        match = pattern.match(os_image)
        if match:
            return os_id, match.group(1)
    match = _SLES.match(os_image)
    if match:
        return "sles", f"{match.group(1)}.{match.group(2) or 0}"
    return None


def _join(repository: str | None, name: str, version: str) -> str:
    base = f"{repository}/{name}" if repository else name
    separator = "@" if version.startswith("sha256:") else ":"
    return f"{base}{separator}{version}"


def _os_version(version: str, os: str | None, kernel: str | None, precompiled: bool) -> str:
    if version.startswith("sha256:") or not os:
        return version
    suffix = f"-{kernel}-{os}" if precompiled and kernel else f"-{os}"
    return version if version.endswith(suffix) else version + suffix


def resolve(
    spec: ComponentSpec,
    default: Image,
    env_var: str,
    environ: Mapping[str, str],
    *,
    os: str | None = None,
    kernel: str | None = None,
    precompiled: bool = False,
) -> str:
    """The full image reference of one component.

    `os` is given only for OS-specific images (the driver): its tag then ends in `-<os>` unless it
    already does (samples often spell the suffix out) or is a digest.
    """
    if spec.image and spec.version:
        return _join(spec.repository, spec.image, _os_version(spec.version, os, kernel, precompiled))
    if spec.image:
        return spec.image
    if environ.get(env_var):
        return environ[env_var]
    return _join(default.repository, default.name, _os_version(default.version, os, kernel, precompiled))
