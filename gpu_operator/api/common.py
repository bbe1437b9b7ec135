"""Building blocks shared by every ClusterPolicy section: the strict base model, the image fields that
every operand repeats, and the small Kubernetes shapes (env, resources, tolerations, probes).

Field names are NVIDIA's JSON names, spelled exactly as in their CRD, so that attribute access in
templates reads like the YAML a user wrote. Attribute docstrings become CRD descriptions, which is
what `kubectl explain` shows.
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal
from functools import cache
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, model_validator

from gpu_operator.api import image_reference
from gpu_operator.api.quoting import quoted

# fullmatch and re.ASCII everywhere: `$` alone accepts a trailing newline, and `\d`/`\w` would accept
# non-ASCII digits and letters; the API server (RE2, same patterns in the CRD) accepts neither.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$", re.ASCII)
# A count as digits is at most 9 of them, so it always fits the int32 the API server stores.
_INT_OR_PERCENT = re.compile(r"^(\d{1,9}|\d+%)$", re.ASCII)
_LABEL_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", re.ASCII)
# Object names as the API server checks them (apimachinery validation: IsDNS1123Label/Subdomain).
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]*$")  # "" (NVIDIA's chart default) means none

INT32_MAX = 2**31 - 1
# The API server stores these as int32 (probe timings, ports, seconds, counts): a larger value would
# wrap on the way into the typed object (4294967301 becomes 5), so both pydantic and the CRD refuse it.
NonNegativeInt = Annotated[int, Field(ge=0, le=INT32_MAX)]
PositiveInt = Annotated[int, Field(ge=1, le=INT32_MAX)]


class Model(BaseModel):
    """Strict base: unknown fields and wrong types are errors (as the API server's schema would say),
    so a typo is reported instead of silently ignored or coerced.

    Empty means unset: an empty list or mapping given for a field that may be unset (`args: []`,
    `env: []`, `tolerations: []`, `labels: {}`, `resources: {}`...) is read as if it were absent.
    NVIDIA's operator only acts on these when they have content (`len(spec.Args) > 0`, `len(...Env) >
    0`, `len(Daemonsets.Tolerations) > 0`... in controllers/object_controls.go), and its Helm values
    write them empty by default; taken literally, `args: []` would replace the image's arguments and
    leave the container with a bare `sh -c`, and `tolerations: []` would drop the default toleration.
    """

    model_config = ConfigDict(
        extra="forbid", strict=True, populate_by_name=True, use_attribute_docstrings=True
    )

    KEEP_EMPTY: ClassVar[frozenset[str]] = frozenset()
    """Fields whose empty value means something else than unset (documented on the field)."""
    EMPTY_IS_UNSET: ClassVar[bool] = False
    """An object of this model whose fields are all empty or null, given for a field that may be unset,
    is unset too (`resources: {limits: {}}`): it says nothing more than its absence would."""

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = _optional_collections(cls)
        empty = [key for key, value in data.items() if key in fields and _is_empty(value, fields[key])]
        if not empty:
            return data
        return {key: value for key, value in data.items() if key not in empty}


_EmptyKind = Literal["list", "mapping", "object"]


def _is_empty(value: Any, kind: _EmptyKind) -> bool:
    """Whether a value given for a field of this kind is empty; a value of the wrong type is not (it is
    refused as it would be anyway)."""
    if kind == "list":
        return value == [] and isinstance(value, list)
    if not isinstance(value, dict):
        return False
    return not value or (kind == "object" and all(v in ([], {}, None) for v in value.values()))


@cache
def _optional_collections(model: type[Model]) -> dict[str, _EmptyKind]:
    """The fields of `model` that may be unset (None) and take a list, a mapping, or an EMPTY_IS_UNSET
    object, by name and alias."""
    found: dict[str, _EmptyKind] = {}
    for name, info in model.model_fields.items():
        members = get_args(info.annotation) if get_origin(info.annotation) in (Union, UnionType) else ()
        if name in model.KEEP_EMPTY or type(None) not in members:
            continue
        for member in members:
            if get_origin(member) is Annotated:
                member = get_args(member)[0]
            origin = get_origin(member) or member
            kind: _EmptyKind | None = None
            if origin is list:
                kind = "list"
            elif origin is dict:
                kind = "mapping"
            elif isinstance(origin, type) and issubclass(origin, Model) and origin.EMPTY_IS_UNSET:
                kind = "object"
            if kind is not None:
                found[name] = kind
                if info.alias:
                    found[info.alias] = kind
    return found


_NOT_INT64 = "does not fit the 64-bit integer the API server stores"


def _in_int64(value: int) -> bool:
    return -(2**63) <= value < 2**63


def _int64(value: int) -> int:
    if not _in_int64(value):
        raise ValueError(_NOT_INT64)
    return value


# Checked by pydantic only: the API server has no bounds to state here (its JSON numbers are float64,
# so it would print them rounded), and refuses a number beyond int64 as "not an integer" anyway.
Int64 = Annotated[int, AfterValidator(_int64)]


def _int_or_percent(value: int | str) -> int | str:
    if isinstance(value, int):
        if not 0 <= value <= INT32_MAX:
            raise ValueError(f"must be an integer from 0 to {INT32_MAX} or a percentage like '25%'")
        return value
    if not _INT_OR_PERCENT.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a non-negative integer or a percentage like '25%'")
    if value.endswith("%") and int(value[:-1]) > 100:
        raise ValueError(f"{quoted(value)} is more than 100%")
    return value


QUANTITY_MAX = 64
"""The longest quantity in its text form: '1.5Gi', '250m' or '1e3' are a few characters."""


def _quantity(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a resource quantity cannot be negative")
        return value
    if len(value) > QUANTITY_MAX:
        raise ValueError(f"{quoted(value)} is not a quantity: longer than {QUANTITY_MAX} characters")
    match = _QUANTITY.fullmatch(value)
    if not match or value.startswith("-"):
        raise ValueError(f"{quoted(value)} is not a Kubernetes quantity such as '500m', '1Gi' or '2'")
    suffix = match.group(3) or ""
    if suffix[:1] in ("e", "E") and not match.group(4):  # an exponent, not exbi ("1Ei")
        # The API server reads the exponent as an int64 and refuses it otherwise ("unable to parse
        # quantity's suffix": apimachinery pkg/api/resource/suffix.go, interpret). Past int64's 19
        # digits it is out without converting them (int() refuses more than 4300).
        sign, digits = suffix[1:2].strip("0123456789"), suffix[1:].lstrip("+-").lstrip("0")
        if len(digits) > 19 or not _in_int64(int(sign + (digits or "0"))):
            raise ValueError(f"its exponent {_NOT_INT64}")
    return value


def _label_keys(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if len(key) > 316 or not _LABEL_NAME.fullmatch(key):
            raise ValueError(f"{quoted(key)} is not a valid label or annotation key")
    return value


def _label_values(value: dict[str, str]) -> dict[str, str]:
    for key, text in value.items():
        if len(text) > 63 or not _LABEL_VALUE.fullmatch(text):
            raise ValueError(
                f"{key}: {quoted(text)} is not a valid label value (at most 63 letters, digits, '-', '_' or "
                "'.', beginning and ending with a letter or digit)"
            )
    return value


ANNOTATIONS_MAX_BYTES = 256 * 1024
"""The API server's limit on all annotations of one object together (keys and values, UTF-8)."""


def _annotations_size(value: dict[str, str]) -> dict[str, str]:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
    if size > ANNOTATIONS_MAX_BYTES:
        raise ValueError(f"annotations total {size} bytes; the API server allows {ANNOTATIONS_MAX_BYTES}")
    return value


def crd_schema(**extra: Any) -> Any:
    """Schema-only additions for the CRD (the API server checks them at admission; pydantic checks the
    same rule in the validator next to it). Keep both saying the same thing."""
    return Field(json_schema_extra=extra)


# The same rules as `_int_or_percent` and `_quantity`, spelled for the API server: the pattern applies
# to the string form, `minimum` to the integer form of an int-or-string value.
_INT_OR_PERCENT_CRD = r"^([0-9]{1,9}|0*(100|[1-9]?[0-9])%)$"
_QUANTITY_CRD = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"

IntOrPercent = Annotated[
    int | str,
    AfterValidator(_int_or_percent),
    crd_schema(pattern=_INT_OR_PERCENT_CRD, minimum=0, maximum=INT32_MAX),
]
Quantity = Annotated[
    int | str, AfterValidator(_quantity), crd_schema(pattern=_QUANTITY_CRD, maxLength=QUANTITY_MAX, minimum=0)
]
LABELS_MAX = 64
"""Labels per object this operator sets them on: well beyond any real set."""
Labels = Annotated[
    dict[str, str], Field(max_length=LABELS_MAX), AfterValidator(_label_keys), AfterValidator(_label_values)
]
Annotations = Annotated[dict[str, str], AfterValidator(_label_keys), AfterValidator(_annotations_size)]


def _pattern(regex: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"{quoted(value)} is not a valid {what}")
        return value

    return AfterValidator(check)


# Every length bound comes before the pattern check: a 1 MiB value is refused by its length at once,
# never run through a pattern first.
LabelKey = Annotated[
    str, Field(max_length=316), _pattern(_LABEL_NAME, "label key"), crd_schema(pattern=_LABEL_NAME.pattern)
]
LabelValue = Annotated[
    str, Field(max_length=63), _pattern(_LABEL_VALUE, "label value"), crd_schema(pattern=_LABEL_VALUE.pattern)
]


ENV_NAME_MAX = 1024
"""The longest environment variable name: no real one is near it, and the kernel counts it into the same
per-string limit as the value (MAX_ARG_STRLEN)."""
EnvName = Annotated[
    str,
    Field(max_length=ENV_NAME_MAX),
    _pattern(_ENV_NAME, "environment variable name"),
    crd_schema(pattern=_ENV_NAME.pattern),
]
DNSLabel = Annotated[
    str,
    Field(max_length=63),
    _pattern(
        _DNS_LABEL,
        "name (DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric)",
    ),
    crd_schema(pattern=_DNS_LABEL.pattern),
]
"""A name the API server requires to be a DNS-1123 label (e.g. a RuntimeClass handler)."""
ObjectName = Annotated[
    str,
    Field(max_length=253),
    _pattern(_DNS_SUBDOMAIN, "object name (DNS-1123 subdomain: lowercase letters, digits, '-' and '.')"),
    crd_schema(pattern=_DNS_SUBDOMAIN.pattern),
]
"""The name of a ConfigMap, Secret, PriorityClass, ServiceAccount...: a DNS-1123 subdomain."""
_NAME_OR_EMPTY = re.compile(f"^$|{_DNS_SUBDOMAIN.pattern}")
NameRef = Annotated[
    str,
    Field(max_length=253),
    _pattern(_NAME_OR_EMPTY, "object name (DNS-1123 subdomain: lowercase letters, digits, '-' and '.')"),
    crd_schema(pattern=_NAME_OR_EMPTY.pattern),
]
"""A reference by name that may be empty: NVIDIA's chart writes "" for "none"."""
ConfigKey = Annotated[
    str,
    Field(max_length=253),
    _pattern(_CONFIG_KEY, "ConfigMap key (letters, digits, '-', '_' and '.')"),
    crd_schema(pattern=_CONFIG_KEY.pattern),
]


# --- text that goes into pods ---------------------------------------------------------------------

TEXT_MAX = 32768
"""The longest environment variable value or argument, in characters: at most 128 KiB of UTF-8, the
kernel's limit on one argument or environment string (MAX_ARG_STRLEN), past which the container cannot
be started at all; far more than any real flag or setting."""
SHORT_TEXT_MAX = 4096
"""The longest other free text that goes into a pod spec (SELinux labels, profile names, sysctls,
regexes): a page, beyond any real value of these fields."""

_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
# The same, for the API server (RE2). A lone surrogate never reaches it as one: its JSON decoder turns
# `\ud800` into U+FFFD, so only the operator (a policy read from YAML by `gpu-operator validate`) sees it.
_PRINTABLE_CRD = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"


def _printable(value: str) -> str:
    """No NUL (execve cuts a string there: the container would get another value, or runc refuses it),
    no other C0 control character or DEL (invisible, they garble `kubectl describe` and logs, and are
    never meant), no lone surrogate (not text: it has no UTF-8 form, so it cannot be written to the API
    server at all). Tab, newline and carriage return are kept: multi-line values and scripts are real."""
    bad = _UNPRINTABLE.search(value)
    if bad is not None:
        char = bad.group()
        what = "a lone surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
        raise ValueError(
            f"contains {what} (U+{ord(char):04X} at character {bad.start()}); only printable text, tab "
            "and newlines go into a container"
        )
    return value


PodText = Annotated[
    str, Field(max_length=TEXT_MAX), AfterValidator(_printable), crd_schema(pattern=_PRINTABLE_CRD)
]
"""An environment variable value or a container argument."""
ShortText = Annotated[
    str, Field(max_length=SHORT_TEXT_MAX), AfterValidator(_printable), crd_schema(pattern=_PRINTABLE_CRD)
]
"""Other free text that goes into a pod spec."""

ENV_MAX = 256
"""Environment variables per container: far more than any operand takes (NVIDIA's samples set at most
a dozen); with TEXT_MAX it bounds what one list can add to every pod of a DaemonSet."""
ARGS_MAX = 256
"""Arguments per container, by the same measure as ENV_MAX."""
PULL_SECRETS_MAX = 32
"""Image pull Secrets per operand: each is a Secret the operator looks up before a change and the
kubelet tries in turn; a registry setup needs one or two."""
LIST_MAX = 64
"""Other lists that go into a pod spec (tolerations, sysctls, supplemental groups, label regexes):
well beyond any real one."""
RESOURCES_MAX = 16
"""Resource names per requests or limits: cpu, memory, ephemeral-storage, hugepages and a few extended
resources."""


def _host_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{quoted(value)} is not an absolute path")
    if ".." in value.split("/"):
        raise ValueError(f"{quoted(value)} contains '..' (the API server refuses it in a hostPath)")
    return value


def _not_root(value: str) -> str:
    if not [part for part in value.split("/") if part not in ("", ".")]:
        raise ValueError(
            f"{quoted(value)} is the host's root directory; the operand would write into all of it"
        )
    return value


# The same two checks as admission rules (no iteration macros: a '..' segment of an absolute path is
# '/../' or a trailing '/..'; the root is nothing but '/' and '.' segments).
_HOST_PATH_RULE = {
    "rule": "self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')",
    "message": "must be an absolute path without '..'",
}
_NOT_ROOT_RULE = {"rule": "!self.matches('^(/\\\\.?)+$')", "message": "must not be the host's root directory"}
HostPath = Annotated[
    str,
    AfterValidator(_host_path),
    Field(max_length=4096),
    crd_schema(**{"x-kubernetes-validations": [_HOST_PATH_RULE]}),
]
"""An absolute host path, as a hostPath volume needs it."""
HostDir = Annotated[
    str,
    AfterValidator(_host_path),
    AfterValidator(_not_root),
    Field(max_length=4096),
    crd_schema(**{"x-kubernetes-validations": [_HOST_PATH_RULE, _NOT_ROOT_RULE]}),
]
"""A host directory an operand writes into: absolute, and never `/` itself."""


def _reference_pattern(pattern: re.Pattern[str], what: str) -> AfterValidator:
    return _pattern(pattern, f"{what} (distribution/reference grammar, which container runtimes use)")


Repository = Annotated[
    str,
    Field(max_length=image_reference.NAME_MAX),
    _reference_pattern(image_reference.REPOSITORY, "image repository: a registry host and/or lowercase path"),
    crd_schema(pattern=image_reference.REPOSITORY.pattern),
]
ImageName = Annotated[
    str,
    Field(max_length=image_reference.REFERENCE_MAX),
    _reference_pattern(image_reference.REFERENCE, "image name or reference"),
    crd_schema(pattern=image_reference.REFERENCE.pattern),
]
ImageVersion = Annotated[
    str,
    Field(max_length=image_reference.TAG_MAX),
    _pattern(
        image_reference.VERSION,
        f"image tag (letters, digits, '_', '.' and '-', at most {image_reference.TAG_MAX}, not starting "
        "with '.' or '-') or 'sha256:<64 hex>' digest",
    ),
    crd_schema(pattern=image_reference.VERSION.pattern),
]


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\") + "'"


IMAGE_RULES: list[JsonValue] = [
    {
        "rule": "!has(self.repository) || (has(self.image) && has(self.version))",
        "message": "repository is set, so image and version must be set too (or give image alone)",
        "fieldPath": ".repository",
    },
    {
        "rule": "!has(self.version) || has(self.image)",
        "message": "version is set but image is not",
        "fieldPath": ".version",
    },
    {
        "rule": (
            "!has(self.repository) || !has(self.image) || "
            f"self.image.matches({_cel_string(image_reference.PATH.pattern)})"
        ),
        "message": "with a repository, image is a lowercase path without registry, tag or digest",
        "fieldPath": ".image",
    },
    {
        "rule": (
            "has(self.repository) || !has(self.version) || !has(self.image) || "
            f"self.image.matches({_cel_string(image_reference.NAME.pattern)})"
        ),
        "message": "version is set, so image must not have a tag or digest of its own",
        "fieldPath": ".image",
    },
    {
        "rule": (
            "!has(self.repository) || !has(self.image) || "
            f"size(self.repository) + size(self.image) < {image_reference.NAME_MAX}"
        ),
        "message": f"repository/image is longer than {image_reference.NAME_MAX} characters",
        "fieldPath": ".image",
    },
]
"""`check_image` as admission rules, so `kubectl apply` refuses what it can at once (has() counts
null-valued fields as absent, as None is here). The length of a name inside a whole reference (image
alone) is left to the operator: CEL would have to parse it."""


def check_image(repository: str | None, image: str | None, version: str | None) -> None:
    """NVIDIA's rule for the three fields: repository/image:version, or image alone as the whole
    reference; we also accept image:version without repository (common in copied samples). The
    reference they make must parse (each field's own pattern checks the field alone)."""
    if repository and not (image and version):
        missing = "image and version" if not (image or version) else ("image" if not image else "version")
        raise ValueError(f"repository is set, so {missing} must be set too (or give image alone)")
    if version and not image:
        raise ValueError("version is set but image is not")
    if not image:
        return
    if repository:
        if not image_reference.PATH.fullmatch(image):
            raise ValueError(
                f"image {quoted(image)} cannot follow repository {quoted(repository)}: with a repository, "
                "image is a lowercase path without registry, tag or digest (the reference is "
                "<repository>/<image>:<version>)"
            )
        name = f"{repository}/{image}"
    elif version:
        if not image_reference.NAME.fullmatch(image):
            raise ValueError(
                f"image {quoted(image)} has a tag or digest of its own, and version {quoted(version)} is set "
                "too: give the tag in one of them"
            )
        name = image
    else:
        name = image_reference.name_of(image)
    if len(name) > image_reference.NAME_MAX:
        raise ValueError(
            f"the image name {quoted(name)} is {len(name)} characters long; image names (registry "
            f"host and path) have at most {image_reference.NAME_MAX}"
        )


class EnvVar(Model):
    """An environment variable set on the operand's main container (overrides one of the same name)."""

    name: EnvName
    """Variable name."""
    value: PodText = ""
    """Variable value, always a plain string."""


EnvList = Annotated[list[EnvVar], Field(max_length=ENV_MAX)]
Args = Annotated[list[PodText], Field(max_length=ARGS_MAX)]
PullSecrets = Annotated[list[ObjectName], Field(max_length=PULL_SECRETS_MAX)]


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": "1e-9", "u": "1e-6", "m": "1e-3", "": "1", "k": "1e3", "M": "1e6", "G": "1e9", "T": "1e12"}
_DECIMAL |= {"P": "1e15", "E": "1e18"}


_WIDE = Context(Emax=MAX_EMAX, Emin=MIN_EMIN)
"""Exponents as wide as Decimal allows: 10 ** 1000000 overflows the default context (Emax 999999)."""
_EXPONENT_BOUND = 10**17
"""Exponents are clamped to this, within MAX_EMAX: beyond it every amount is out of any real range."""


def quantity_value(value: int | str) -> Decimal:
    """The amount a Kubernetes quantity stands for ('500m' is 0.5, '1Gi' 1073741824, '1e3' 1000),
    for comparisons. Any exponent the API server accepts is computed, none overflows ('1e1000000')."""
    if isinstance(value, int):
        return Decimal(value)  # exact at any size (str() refuses ints of more than 4300 digits)
    text = value.lstrip("+")
    number = re.match(r"[0-9]*\.?[0-9]*", text)
    digits = number.group(0) if number else ""
    suffix = text[len(digits) :]
    amount = Decimal(digits or "0")
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    if suffix in _DECIMAL:
        return amount * Decimal(_DECIMAL[suffix])
    exponent = int(suffix[1:])  # e3, E-2
    return amount.scaleb(max(-_EXPONENT_BOUND, min(_EXPONENT_BOUND, exponent)), _WIDE)


CPU_MAX = 1_000_000
"""The most CPUs (cores) a request or limit may give: the largest machines have a few thousand hardware
threads, so a million leaves room for any future node while refusing typos such as 1e100, which no
node can ever hold (the pod would stay Pending forever)."""
BYTES_MAX = 2**50
"""The most memory (memory, hugepages-*) a request or limit may give: 1 PiB, more than ten times the
memory of the largest single machines (tens of TiB)."""
AMOUNT_MAX = 2**63 - 1
"""The most of any other resource: what the scheduler and the kubelet count in (int64)."""


def _bound_of(resource: str) -> tuple[Decimal, str]:
    if resource == "cpu":
        return Decimal(CPU_MAX), f"{CPU_MAX} cores"
    if resource == "memory" or resource.startswith("hugepages-"):
        return Decimal(BYTES_MAX), "1Pi"
    return Decimal(AMOUNT_MAX), f"{AMOUNT_MAX} (int64)"


def _resource_amounts(value: dict[str, int | str]) -> dict[str, int | str]:
    for name, amount in value.items():
        if len(name) > 316 or not _LABEL_NAME.fullmatch(name):
            raise ValueError(
                f"{quoted(name)} is not a resource name (cpu, memory, ephemeral-storage, hugepages-<size> "
                "or a qualified name such as nvidia.com/gpu)"
            )
        bound, said = _bound_of(name)
        if quantity_value(amount) > bound:
            raise ValueError(f"{name}: {quoted(amount)} is more than a node can hold (at most {said})")
    return value


Resources = Annotated[dict[str, Quantity], Field(max_length=RESOURCES_MAX), AfterValidator(_resource_amounts)]
"""Amounts by resource name, each within what a node can hold."""


class ResourceRequirements(Model):
    """CPU, memory and other resource requests and limits of the operand's containers."""

    EMPTY_IS_UNSET: ClassVar[bool] = True

    limits: Resources | None = None
    """Maximum amount of each resource, e.g. {cpu: 500m, memory: 1Gi}."""
    requests: Resources | None = None
    """Minimum amount of each resource the scheduler reserves."""

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        # The API server refuses a request above its limit (core validation of the pod template).
        for name, request in (self.requests or {}).items():
            limit = (self.limits or {}).get(name)
            if limit is not None and quantity_value(request) > quantity_value(limit):
                raise ValueError(f"requests.{name} ({request}) is more than limits.{name} ({limit})")
        return self


class Toleration(Model):
    """A pod toleration (core/v1 Toleration)."""

    # `_as_the_api_server` below, as admission rules (null-valued fields count as absent in has()).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "(has(self.key) && self.key != '')"
                        " || (has(self.operator) && self.operator == 'Exists')"
                    ),
                    "message": "operator must be Exists when key is empty (a toleration of every taint)",
                    "fieldPath": ".operator",
                },
                {
                    "rule": (
                        "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')"
                    ),
                    "message": "tolerationSeconds is only allowed with effect NoExecute",
                    "fieldPath": ".effect",
                },
                {
                    "rule": (
                        "!has(self.operator) || self.operator != 'Exists'"
                        " || !has(self.value) || self.value == ''"
                    ),
                    "message": "value must be empty when operator is Exists",
                    "fieldPath": ".value",
                },
            ]
        }
    )

    key: LabelKey | None = None
    """Taint key the toleration applies to; empty with operator Exists means every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal (default Equal)."""
    value: LabelValue | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    tolerationSeconds: Int64 | None = None
    """How long a NoExecute taint is tolerated before eviction."""

    @model_validator(mode="after")
    def _as_the_api_server(self) -> Toleration:
        # core/v1 ValidateTolerations: the API server refuses the pod template otherwise.
        if not self.key and self.operator != "Exists":
            raise ValueError("operator must be Exists when key is empty (a toleration of every taint)")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is only allowed with effect NoExecute")
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        return self


# Pod security context (core/v1), typed as the API server types it: a wrong type here would fail every
# DaemonSet apply ("expected numeric") instead of being reported on the policy.
UserOrGroupID = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A Linux user or group ID as the API server accepts it (0 to 2147483647)."""


class SELinuxOptions(Model):
    """SELinux labels."""

    user: ShortText | None = None
    """SELinux user label."""
    role: ShortText | None = None
    """SELinux role label."""
    type: ShortText | None = None
    """SELinux type label."""
    level: ShortText | None = None
    """SELinux level label."""


class ProfileRef(Model):
    """A profile: the runtime's default, none, or one on the node."""

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    """RuntimeDefault, Unconfined or Localhost (then localhostProfile names it)."""
    localhostProfile: ShortText | None = None
    """The profile on the node, when type is Localhost."""


class WindowsSecurityContextOptions(Model):
    """Windows-specific settings (accepted; operands run on Linux)."""

    gmsaCredentialSpecName: ShortText | None = None
    """Name of the GMSA credential spec."""
    gmsaCredentialSpec: PodText | None = None
    """GMSA credential spec content."""
    runAsUserName: ShortText | None = None
    """Windows user name."""
    hostProcess: bool | None = None
    """Run as a Windows host process."""


class Sysctl(Model):
    """A namespaced kernel parameter."""

    name: ShortText
    """Parameter name."""
    value: ShortText
    """Parameter value."""


class PodSecurityContext(Model):
    """Pod-level security context (core/v1 PodSecurityContext)."""

    runAsUser: UserOrGroupID | None = None
    """User ID the containers run as."""
    runAsGroup: UserOrGroupID | None = None
    """Primary group ID of the containers."""
    runAsNonRoot: bool | None = None
    """Refuse to start containers that would run as root."""
    supplementalGroups: Annotated[list[UserOrGroupID], Field(max_length=LIST_MAX)] | None = None
    """Additional group IDs of the containers."""
    supplementalGroupsPolicy: Literal["Merge", "Strict"] | None = None
    """How supplemental groups are computed."""
    fsGroup: UserOrGroupID | None = None
    """Group ID that owns the pod's volumes."""
    fsGroupChangePolicy: Literal["OnRootMismatch", "Always"] | None = None
    """When volume ownership is changed to fsGroup."""
    seLinuxOptions: SELinuxOptions | None = None
    """SELinux labels."""
    seLinuxChangePolicy: Literal["MountOption", "Recursive"] | None = None
    """How the SELinux label is applied to volumes."""
    seccompProfile: ProfileRef | None = None
    """Seccomp profile."""
    appArmorProfile: ProfileRef | None = None
    """AppArmor profile."""
    sysctls: Annotated[list[Sysctl], Field(max_length=LIST_MAX)] | None = None
    """Namespaced sysctls."""
    windowsOptions: WindowsSecurityContextOptions | None = None
    """Windows settings."""


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

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": IMAGE_RULES})

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
    imagePullSecrets: PullSecrets | None = None
    """Names of Secrets in the operand namespace used to pull the image."""
    resources: ResourceRequirements | None = None
    """Resources of the main container."""
    args: Args | None = None
    """Arguments that replace the main container's default arguments."""
    env: EnvList | None = None
    """Environment variables set on the main container."""
    hostNetwork: bool | None = None
    """Run the operand pods in the host's network namespace."""

    def is_enabled(self) -> bool:
        return self.DEFAULT_ENABLED if self.enabled is None else self.enabled

    @model_validator(mode="after")
    def _complete_image(self) -> ComponentSpec:
        check_image(self.repository, self.image, self.version)
        return self


class OffByDefault(ComponentSpec):
    DEFAULT_ENABLED: ClassVar[bool] = False


class ConfigMapRef(Model):
    """A reference to a ConfigMap in the operand namespace."""

    name: NameRef | None = None
    """ConfigMap name."""


class ConfigWithDefault(Model):
    """A ConfigMap of named configurations and the entry used when a node names none."""

    name: NameRef | None = None
    """ConfigMap name holding the configurations."""
    default: ConfigKey | None = None
    """Configuration used on nodes without an explicit config label."""


FREE_FORM_MAX_NODES = 1000
FREE_FORM_MAX_STRING = 4096
FREE_FORM_MAX_PROPERTIES = 64


def _bounded(value: Any) -> Any:
    """Size limits of a free-form section (depth is limited for the whole spec, see api.MAX_DEPTH)."""
    nodes, stack = 0, [value]
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > FREE_FORM_MAX_NODES:
            raise ValueError(f"has more than {FREE_FORM_MAX_NODES} values in all")
        if isinstance(item, dict):
            if len(item) > FREE_FORM_MAX_PROPERTIES:
                raise ValueError(f"a mapping here has more than {FREE_FORM_MAX_PROPERTIES} keys")
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and len(item) > FREE_FORM_MAX_STRING:
            raise ValueError(f"a string here is longer than {FREE_FORM_MAX_STRING} characters")
        elif isinstance(item, int) and not isinstance(item, bool) and not _in_int64(item):
            raise ValueError(f"a number here, {quoted(item)}, {_NOT_INT64}")
    return value


FreeForm = Annotated[
    dict[str, Any], AfterValidator(_bounded), crd_schema(maxProperties=FREE_FORM_MAX_PROPERTIES)
]
"""A section passed through unchanged (kept, not pruned by the API server), with size limits: the CRD
bounds its keys (maxProperties); pydantic its total size and strings."""
