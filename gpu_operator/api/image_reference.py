"""Image references: the grammar container runtimes parse them with, and how a policy's `repository`,
`image` and `version` make one.

The grammar is distribution/reference's (github.com/distribution/reference, regexp.go and
normalize.go), which the kubelet, containerd and CRI-O parse images with: a reference it refuses can
never be pulled, so a policy that would produce one is refused too. NVIDIA's operator joins the three
fields as `<repository>/<image>:<version>` (`@<version>` for a `sha256:` digest), or takes `image`
alone as the whole reference (api/nvidia/v1/clusterpolicy_types.go imagePath); its CRD checks
nothing but that `image` contains a letter, digit or dash.

Each pattern is written once, for both Python's `re` (with re.ASCII) and the API server's RE2, and
kept free of nested quantifiers that could backtrack badly on 4096 characters.
"""

from __future__ import annotations

import re

NAME_MAX = 255
"""The longest name (registry host and path) distribution/reference accepts (NameTotalLengthMax)."""
REFERENCE_MAX = 4096
"""The longest image reference accepted at all: far beyond any real one (a 255-character name, a
128-character tag and a sha512 digest make 521), so that nothing longer reaches the patterns."""
TAG_MAX = 128
REAL_REFERENCE_MAX = 521
"""The longest reference that can be pulled: a 255-character name, a 128-character tag and a sha512
digest (quoted whole in messages; a longer one is quoted by its start and length)."""

_DOMAIN_COMPONENT = r"([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"({_DOMAIN_COMPONENT}(\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(:[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_PATH = rf"{_PATH_COMPONENT}(/{_PATH_COMPONENT})*"
_NAME = rf"({_DOMAIN}/)?{_PATH}"
_TAG = rf"[a-zA-Z0-9_][a-zA-Z0-9_.-]{{0,{TAG_MAX - 1}}}"
_SHA256 = r"sha256:[a-f0-9]{64}"
_DIGEST = rf"({_SHA256}|sha384:[a-f0-9]{{96}}|sha512:[a-f0-9]{{128}})"

REPOSITORY = re.compile(rf"^({_DOMAIN}|{_PATH_COMPONENT})(/{_PATH_COMPONENT})*$", re.ASCII)
"""`repository`: a registry host (with its port) and path, a registry host alone, or a path alone (then
the image is on Docker Hub)."""
PATH = re.compile(rf"^{_PATH}$", re.ASCII)
"""`image` with a `repository`: path components only (lowercase), joined after the repository."""
NAME = re.compile(rf"^{_NAME}$", re.ASCII)
"""`image` with a `version` but no `repository`: a name without tag or digest."""
REFERENCE = re.compile(rf"^{_NAME}(:{_TAG})?(@{_DIGEST})?$", re.ASCII)
"""`image` alone: a whole reference, tag and digest optional."""
VERSION = re.compile(rf"^({_TAG}|{_SHA256})$", re.ASCII)
"""`version`: a tag, or a sha256 digest (NVIDIA joins only `sha256:` with '@'; any other `x:y` would
become a second tag)."""

DOCKER_HUB = "docker.io"


def name_of(reference: str) -> str:
    """The name (registry host and path) of a reference, without its tag and digest."""
    name = reference.split("@", 1)[0]
    colon, slash = name.rfind(":"), name.rfind("/")
    return name[:colon] if colon > slash else name


def registry_of(name: str) -> str | None:
    """The registry host (and port) a name or reference says, or None when it says none: its first
    component is a host only when it has a '.' or ':', is `localhost` or has capitals
    (distribution/reference splitDockerDomain); otherwise the runtime pulls it from Docker Hub."""
    first, slash, _ = name.partition("/")
    if not slash:
        return None
    if "." in first or ":" in first or first == "localhost" or first != first.lower():
        return first
    return None


def on_docker_hub(reference: str) -> str:
    """The reference a runtime pulls for one that names no registry: `nvidia/driver:1` is
    `docker.io/nvidia/driver:1`, `busybox` is `docker.io/library/busybox`."""
    return f"{DOCKER_HUB}/{reference}" if "/" in name_of(reference) else f"{DOCKER_HUB}/library/{reference}"
