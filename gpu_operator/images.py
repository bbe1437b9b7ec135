"""Image references: NVIDIA's resolution rules (policy triple, then operator env var, then built-in
default) and the OS suffix of driver tags."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_operator.api.common import ComponentSpec
from gpu_operator.components import Image

OS_ID_LABEL = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION_LABEL = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
KERNEL_LABEL = "feature.node.kubernetes.io/kernel-version.full"

# RHEL-like distributions tag their images with the major version only (NVIDIA's resolveDriverTag).
_MAJOR_ONLY = {"rhel", "rocky", "ol", "centos", "almalinux"}


def os_tag(labels: Mapping[str, str]) -> str | None:
    """`ubuntu22.04`, `rhel9`, ... from a node's NFD labels; None when NFD has not labelled it."""
    os_id = labels.get(OS_ID_LABEL)
    version = labels.get(OS_VERSION_LABEL)
    if not os_id or not version:
        return None
    if os_id in _MAJOR_ONLY:
        version = version.split(".")[0]
    return f"{os_id}{version}"


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
