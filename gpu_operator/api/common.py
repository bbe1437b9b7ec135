"""Building blocks shared by every ClusterPolicy section: the strict base model, the image fields that
every operand repeats, and the small Kubernetes shapes (env, resources, tolerations, probes).

Field names are NVIDIA's JSON names, spelled exactly as in their CRD, so that attribute access in
templates reads like the YAML a user wrote. Attribute docstrings become CRD descriptions, which is
what `kubectl explain` shows.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# fullmatch and re.ASCII everywhere: `$` alone accepts a trailing newline, and `\d`/`\w` would accept
# non-ASCII digits and letters; the API server (RE2, same patterns in the CRD) accepts neither.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$", re.ASCII)
_INT_OR_PERCENT = re.compile(r"^\d+%?$", re.ASCII)
# A registry host (with optional port) and path, as Docker reference grammar allows (lowercase path).
_REPOSITORY = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9.-]*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
# NVIDIA allows only `[a-zA-Z0-9-]+`; we also accept path segments (`nvidia/driver`), as the seed
# article's sample does.
_IMAGE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_FULL_IMAGE = re.compile(
    r"^[a-zA-Z0-9][a-zA-Z0-9.-]*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[\w][\w.-]{0,127})?(@sha256:[a-f0-9]{64})?$",
    re.ASCII,
)
_TAG = re.compile(r"^[\w][\w.-]{0,127}$", re.ASCII)
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_LABEL_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class Model(BaseModel):
    """Strict base: unknown fields and wrong types are errors (as the API server's schema would say),
    so a typo is reported instead of silently ignored or coerced."""

    model_config = ConfigDict(
        extra="forbid", strict=True, populate_by_name=True, use_attribute_docstrings=True
    )


def _int_or_percent(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be a non-negative integer or a percentage like '25%'")
        return value
    if not _INT_OR_PERCENT.fullmatch(value):
        raise ValueError(f"{value!r} is not a non-negative integer or a percentage like '25%'")
    if value.endswith("%") and int(value[:-1]) > 100:
        raise ValueError(f"{value!r} is more than 100%")
    return value


def _quantity(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a resource quantity cannot be negative")
        return value
    if not _QUANTITY.fullmatch(value) or value.startswith("-"):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as '500m', '1Gi' or '2'")
    return value


def _label_keys(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not _LABEL_NAME.fullmatch(key) or len(key) > 316:
            raise ValueError(f"{key!r} is not a valid label or annotation key")
    return value


def crd_schema(**extra: Any) -> Any:
    """Schema-only additions for the CRD (the API server checks them at admission; pydantic checks the
    same rule in the validator next to it). Keep both saying the same thing."""
    return Field(json_schema_extra=extra)


# The same rules as `_int_or_percent` and `_quantity`, spelled for the API server: the pattern applies
# to the string form, `minimum` to the integer form of an int-or-string value.
_INT_OR_PERCENT_CRD = r"^([0-9]+|0*(100|[1-9]?[0-9])%)$"
_QUANTITY_CRD = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"

IntOrPercent = Annotated[
    int | str, AfterValidator(_int_or_percent), crd_schema(pattern=_INT_OR_PERCENT_CRD, minimum=0)
]
Quantity = Annotated[int | str, AfterValidator(_quantity), crd_schema(pattern=_QUANTITY_CRD, minimum=0)]
Labels = Annotated[dict[str, str], AfterValidator(_label_keys)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]


def _pattern(regex: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value

    return AfterValidator(check)


Repository = Annotated[
    str,
    _pattern(_REPOSITORY, "image repository (registry host and path)"),
    crd_schema(pattern=_REPOSITORY.pattern),
]
EnvName = Annotated[
    str, _pattern(_ENV_NAME, "environment variable name"), crd_schema(pattern=_ENV_NAME.pattern)
]


def _image(value: str) -> str:
    if _IMAGE.fullmatch(value) or _FULL_IMAGE.fullmatch(value):
        return value
    raise ValueError(f"{value!r} is not a valid image name or reference")


def _version(value: str) -> str:
    if _TAG.fullmatch(value) or _DIGEST.fullmatch(value):
        return value
    raise ValueError(f"{value!r} is not a valid image tag or 'sha256:<64 hex>' digest")


ImageName = Annotated[
    str, AfterValidator(_image), crd_schema(pattern=f"{_IMAGE.pattern}|{_FULL_IMAGE.pattern}")
]
ImageVersion = Annotated[
    str, AfterValidator(_version), crd_schema(pattern=f"{_TAG.pattern}|{_DIGEST.pattern}")
]


class EnvVar(Model):
    """An environment variable set on the operand's main container (overrides one of the same name)."""

    name: EnvName
    """Variable name."""
    value: str = ""
    """Variable value, always a plain string."""


class ResourceRequirements(Model):
    """CPU, memory and other resource requests and limits of the operand's containers."""

    limits: dict[str, Quantity] | None = None
    """Maximum amount of each resource, e.g. {cpu: 500m, memory: 1Gi}."""
    requests: dict[str, Quantity] | None = None
    """Minimum amount of each resource the scheduler reserves."""


class Toleration(Model):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = None
    """Taint key the toleration applies to; empty with operator Exists means every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal (default Equal)."""
    value: str | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    tolerationSeconds: int | None = None
    """How long a NoExecute taint is tolerated before eviction."""


class ProbeSpec(Model):
    """Timing of a container probe."""

    initialDelaySeconds: NonNegativeInt | None = None
    """Seconds after container start before the first probe."""
    timeoutSeconds: PositiveInt | None = None
    """Seconds after which one probe times out."""
    periodSeconds: PositiveInt | None = None
    """Seconds between probes."""
    successThreshold: PositiveInt | None = None
    """Consecutive successes that count as success."""
    failureThreshold: PositiveInt | None = None
    """Consecutive failures that count as failure."""


class ComponentSpec(Model):
    """Fields every operand spec repeats: on/off, image and container settings."""

    # `_complete_image` below, as admission rules, so `kubectl apply` rejects a half-given image at once.
    # Null-valued fields count as absent in CEL's has(), as None does here.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.repository) || (has(self.image) && has(self.version))",
                    "message": (
                        "repository is set, so image and version must be set too (or give image alone)"
                    ),
                    "fieldPath": ".repository",
                },
                {
                    "rule": "!has(self.version) || has(self.image)",
                    "message": "version is set but image is not",
                    "fieldPath": ".version",
                },
            ]
        }
    )

    DEFAULT_ENABLED: ClassVar[bool] = True

    enabled: bool | None = None
    """Deploy this component; when absent NVIDIA's default for the component applies."""
    repository: Repository | None = None
    """Image registry and path, e.g. nvcr.io/nvidia."""
    image: ImageName | None = None
    """Image name; alone (without repository and version) it is taken as the full image reference."""
    version: ImageVersion | None = None
    """Image tag, or a digest 'sha256:...'."""
    imagePullPolicy: Literal["Always", "Never", "IfNotPresent"] | None = None
    """Image pull policy (default IfNotPresent)."""
    imagePullSecrets: list[str] | None = None
    """Names of Secrets in the operand namespace used to pull the image."""
    resources: ResourceRequirements | None = None
    """Resources of the main container."""
    args: list[str] | None = None
    """Arguments that replace the main container's default arguments."""
    env: list[EnvVar] | None = None
    """Environment variables set on the main container."""
    hostNetwork: bool | None = None
    """Run the operand pods in the host's network namespace."""

    def is_enabled(self) -> bool:
        return self.DEFAULT_ENABLED if self.enabled is None else self.enabled

    @model_validator(mode="after")
    def _complete_image(self) -> ComponentSpec:
        # NVIDIA's rule: repository/image:version, or image alone as a full reference. We also accept
        # image:version without repository (common in copied samples); anything else is ambiguous.
        if self.repository and not (self.image and self.version):
            missing = (
                "image and version"
                if not (self.image or self.version)
                else ("image" if not self.image else "version")
            )
            raise ValueError(f"repository is set, so {missing} must be set too (or give image alone)")
        if self.version and not self.image:
            raise ValueError("version is set but image is not")
        return self


class OffByDefault(ComponentSpec):
    DEFAULT_ENABLED: ClassVar[bool] = False


class ConfigMapRef(Model):
    """A reference to a ConfigMap in the operand namespace."""

    name: str | None = None
    """ConfigMap name."""


class ConfigWithDefault(Model):
    """A ConfigMap of named configurations and the entry used when a node names none."""

    name: str | None = None
    """ConfigMap name holding the configurations."""
    default: str | None = None
    """Configuration used on nodes without an explicit config label."""


def free_form(description: str) -> Any:
    """A field whose content is a Kubernetes object we pass through unchanged (kept, not pruned)."""
    return Field(
        default=None,
        description=description,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
