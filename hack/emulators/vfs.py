"""A container's view of files: its volume mounts over the node's host, ConfigMaps and emptyDirs.

Images find each other's results through paths (the driver root at ``/driver-root`` or
``/run/nvidia/driver``, ``/run/nvidia/validations/driver-ready``, ``/config/config.yaml`` linking to
``/available-configs/<name>``), and several NVIDIA breaks are exactly a path that resolves in one
container and not in another (B4, B8, B9 in the fidelity reference). So a path is resolved the way
the kernel does it for that container: the longest mount prefix decides where it lives, symlinks are
followed in the same container, and anything not under a mount is the container's own root
filesystem (the image's files plus what the container wrote, lost when it restarts).
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .node import Entry, NodeState, Symlink
from .podspec import Container, Mount, Pod, Volume

ConfigMapLookup = Callable[[str, str], Mapping[str, str] | None]
"""(namespace, name) → the ConfigMap's data, None if it does not exist."""

MAX_SYMLINKS = 8


@dataclass(frozen=True)
class Where:
    """Where a container path lives."""

    kind: str
    """host, configMap, emptyDir, image (the container's own root filesystem), or none."""
    path: str
    """host: the host path; configMap: the key; emptyDir/image: the path inside it."""
    volume: Volume | None = None
    read_only: bool = False


class ContainerFS:
    def __init__(
        self,
        pod: Pod,
        container: Container,
        node: NodeState,
        empty_dirs: dict[str, dict[str, Entry]],
        config_maps: ConfigMapLookup,
        image_files: Mapping[str, Entry],
    ) -> None:
        self.pod = pod
        self.container = container
        self.node = node
        self.empty_dirs = empty_dirs
        self.config_maps = config_maps
        # The image's files and what this container run wrote outside its mounts.
        self.rootfs: dict[str, Entry] = dict(image_files)
        self.mounts = sorted(container.mounts, key=lambda m: len(m.path), reverse=True)

    def where(self, path: str) -> Where:
        path = posixpath.normpath(path)
        for mount in self.mounts:
            if path == mount.path or path.startswith(mount.path.rstrip("/") + "/"):
                rest = path[len(mount.path) :].lstrip("/")
                return self._in_volume(mount, rest)
        return Where("image", path)

    def _in_volume(self, mount: Mount, rest: str) -> Where:
        volume = self.pod.volumes.get(mount.volume)
        if volume is None:
            return Where("none", rest)
        inner = posixpath.join(mount.sub_path, rest) if mount.sub_path and rest else mount.sub_path or rest
        if volume.kind == "hostPath":
            host = posixpath.normpath(posixpath.join(volume.source, inner)) if inner else volume.source
            return Where("host", host, volume, mount.read_only)
        if volume.kind == "configMap":
            return Where("configMap", inner, volume, True)
        if volume.kind == "emptyDir":
            return Where("emptyDir", "/" + inner, volume, mount.read_only)
        return Where("none", inner, volume)

    def host_path(self, path: str) -> str | None:
        """The host path behind a container path, if it is on a hostPath mount."""
        found = self.where(path)
        return found.path if found.kind == "host" else None

    def _config_map_files(self, volume: Volume) -> dict[str, str] | None:
        data = self.config_maps(self.pod.namespace, volume.source)
        if data is None:
            return None
        if volume.items:
            return {path: data[key] for key, path in volume.items if key in data}
        return dict(data)

    def _lookup(self, path: str) -> Entry | None:
        found = self.where(path)
        if found.kind == "host":
            return self.node.read(found.path)
        if found.kind == "configMap" and found.volume is not None:
            files = self._config_map_files(found.volume) or {}
            return files.get(found.path)
        if found.kind == "emptyDir" and found.volume is not None:
            return self.empty_dirs.setdefault(found.volume.name, {}).get(found.path)
        if found.kind == "image":
            return self.rootfs.get(found.path)
        return None

    def resolve(self, path: str) -> str:
        """The path with every symlink followed (in this container's mount namespace)."""
        path = posixpath.normpath(path)
        for _ in range(MAX_SYMLINKS):
            entry = self._lookup(path)
            if not isinstance(entry, Symlink):
                return path
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), entry.target))
        return path

    def read(self, path: str) -> str | None:
        """File content, following symlinks; None when it does not exist (or is a directory)."""
        entry = self._lookup(self.resolve(path))
        return entry if isinstance(entry, str) else None

    def exists(self, path: str) -> bool:
        resolved = self.resolve(path)
        if self._lookup(resolved) is not None:
            return True
        return self.is_dir(resolved)

    def is_dir(self, path: str) -> bool:
        found = self.where(path)
        if found.kind == "host":
            return self.node.is_dir(found.path)
        if found.kind == "configMap":
            return (
                found.path in ("", ".")
                and found.volume is not None
                and self._config_map_files(found.volume) is not None
            )
        if found.kind == "emptyDir":
            return found.path == "/" or any(
                p.startswith(found.path.rstrip("/") + "/")
                for p in self.empty_dirs.get(found.volume.name if found.volume else "", {})
            )
        if found.kind == "image":
            prefix = found.path.rstrip("/") + "/"
            return found.path == "/" or any(p.startswith(prefix) for p in self.rootfs)
        return False

    def listdir(self, path: str) -> list[str]:
        found = self.where(self.resolve(path))
        if found.kind == "configMap" and found.volume is not None:
            return sorted(self._config_map_files(found.volume) or {})
        if found.kind == "host":
            return self.node.listdir(found.path)
        return []

    def write(self, path: str, content: Entry) -> bool:
        """Write a file (or symlink). False when the path is read-only (a ConfigMap, a readOnly mount)."""
        found = self.where(path)
        if found.read_only or found.kind in ("configMap", "none"):
            return False
        if found.kind == "host":
            self.node.write(found.path, content)
        elif found.kind == "emptyDir" and found.volume is not None:
            self.empty_dirs.setdefault(found.volume.name, {})[found.path] = content
        else:
            self.rootfs[found.path] = content
        return True

    def remove_glob(self, pattern: str) -> None:
        """`rm -f PATTERN` (the shell expands the glob in the last path component; as sh does, `*`
        does not match a leading dot: `*-ready` leaves the driver's `.driver-ctr-ready`)."""
        folder, name = posixpath.split(posixpath.normpath(pattern))

        def matches(entry: str) -> bool:
            return fnmatch.fnmatchcase(entry, name) and (not entry.startswith(".") or name.startswith("."))

        found = self.where(folder)
        prefix = found.path.rstrip("/") + "/"
        if found.kind == "host":
            names = [p for p in self.node.files if p.startswith(prefix) and "/" not in p[len(prefix) :]]
            self.node.remove(p for p in names if matches(p[len(prefix) :]))
            return
        if found.kind == "emptyDir" and found.volume is not None:
            files = self.empty_dirs.setdefault(found.volume.name, {})
        elif found.kind == "image":
            files = self.rootfs
        else:
            return
        for path in [p for p in files if p.startswith(prefix) and matches(p[len(prefix) :])]:
            del files[path]
