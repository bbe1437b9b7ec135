"""The ClusterPolicy models: defaults, validation with field paths, and agreement with the CRD's rules."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_operator.api import PolicyError, parse_document, parse_spec
from gpu_operator.api.common import CPU_MAX, quantity_value
from gpu_operator.api.crd import crd
from gpu_operator.api.quoting import quoted
from gpu_operator.core.components import COMPONENTS

SPEC = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def crd_node(dotted: str) -> dict[str, Any]:
    node: dict[str, Any] = SPEC
    for part in dotted.split("."):
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    return node


def errors(spec: Any) -> dict[str, str]:
    with pytest.raises(PolicyError) as info:
        parse_spec(spec)
    return {e.path: e.message for e in info.value.errors}


def accepts(spec: dict[str, Any]) -> bool:
    try:
        parse_spec(spec)
    except PolicyError:
        return False
    return True


def test_empty_spec_has_nvidias_defaults() -> None:
    spec = parse_spec({})
    assert parse_spec(None) == spec
    enabled = {c.name for c in COMPONENTS if c.enabled(spec)}
    assert enabled == {
        "driver",
        "container-toolkit",
        "operator-validator",
        "device-plugin",
        "mps-control-daemon",
        "dcgm",
        "dcgm-exporter",
        "gpu-feature-discovery",
        "mig-manager",
    }
    assert spec.operator.runtimeClass == "nvidia"
    assert spec.daemonsets.priorityClassName == "system-node-critical"
    assert spec.mig.strategy == "single"
    assert spec.cdi.enabled is True
    assert spec.unsupported_enabled() == []


def test_a_component_is_enabled_by_its_section_and_a_copy_of_the_spec_asks_again() -> None:
    """Component.enabled reads ClusterPolicySpec.enabled_sections, kept on the spec once asked: it says
    what each section's is_enabled says, and a copy with a changed section does not keep the original's."""
    spec = parse_spec({"dcgm": {"enabled": False}, "nodeStatusExporter": {"enabled": True}})
    # The sandbox stacks have rules of their own (sandboxWorkloads, its mode: tests/unit/test_workloads.py).
    for component in (c for c in COMPONENTS if c.enable_rule is None):
        assert component.enabled(spec) == component.spec(spec).is_enabled(), component.name
    assert "dcgm" not in spec.enabled_sections and "nodeStatusExporter" in spec.enabled_sections
    off = spec.model_copy(update={"driver": spec.driver.model_copy(update={"enabled": False})})
    assert "driver" in spec.enabled_sections and "driver" not in off.enabled_sections
    assert (
        off != spec
        and parse_spec({"dcgm": {"enabled": False}, "nodeStatusExporter": {"enabled": True}}) == spec
    )


def test_document_checks() -> None:
    ok = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": {}}
    assert parse_document(ok) == parse_spec({})
    with pytest.raises(PolicyError) as info:
        parse_document({**ok, "kind": "Pod", "metadata": {}, "spec": {"driver": {"foo": 1}}})
    assert [e.path for e in info.value.errors] == ["kind", "metadata.name", "spec.driver.foo"]
    with pytest.raises(PolicyError):
        parse_document(["not", "a", "mapping"])


def _triple(
    repository: str = "nvcr.io/nvidia", image: str = "driver", version: str = "550"
) -> dict[str, Any]:
    return {"driver": {"repository": repository, "image": image, "version": version}}


@pytest.mark.parametrize(
    ("spec", "path", "fragment"),
    [
        ({"driver": {"foo": 1}}, "spec.driver.foo", "unknown field"),
        ({"driver": {"enabled": "yes"}}, "spec.driver.enabled", "boolean"),
        ({"driver": {"enabled": 1}}, "spec.driver.enabled", "boolean"),
        ({"mig": {"strategy": "double"}}, "spec.mig.strategy", "'none', 'single' or 'mixed'"),
        ({"toolkit": {"image": "Bad Image!"}}, "spec.toolkit.image", "not a valid image"),
        ({"toolkit": {"image": "nvidia/toolkit\n"}}, "spec.toolkit.image", "not a valid image"),
        (
            {"toolkit": {"image": "toolkit", "version": "v1\n"}},
            "spec.toolkit.version",
            "not a valid image tag",
        ),
        ({"driver": {"repository": "nvcr.io/nvidia"}}, "spec.driver", "image and version must be set"),
        ({"driver": {"version": "550"}}, "spec.driver", "version is set but image is not"),
        # References a container runtime can never pull (distribution/reference's grammar).
        (_triple("nvcr.io/NVIDIA"), "spec.driver.repository", "not a valid image repository"),
        (_triple("nvcr.io//nvidia"), "spec.driver.repository", "not a valid image repository"),
        (_triple("nvcr.io/nvidia/"), "spec.driver.repository", "not a valid image repository"),
        (_triple(image="driver:550"), "spec.driver", "cannot follow repository 'nvcr.io/nvidia'"),
        (_triple(image="localhost:5000/driver"), "spec.driver", "cannot follow repository"),
        (_triple(version="-550"), "spec.driver.version", "not a valid image tag"),
        (_triple(version="sha512:" + "a" * 100), "spec.driver.version", "not a valid image tag"),
        (_triple(version="sha256:abc"), "spec.driver.version", "not a valid image tag"),
        (_triple(version="v" * 129), "spec.driver.version", "at most 128 characters"),
        (_triple("r" * 240, "driver" * 3), "spec.driver", "255"),
        ({"toolkit": {"image": "t:v1", "version": "v2"}}, "spec.toolkit", "has a tag or digest of its own"),
        ({"toolkit": {"image": "a" * 256}}, "spec.toolkit", "is 256 characters long"),
        ({"toolkit": {"image": "a" * 4097}}, "spec.toolkit.image", "at most 4096 characters"),
        ({"toolkit": {"image": "nvcr.io/t:"}}, "spec.toolkit.image", "not a valid image"),
        ({"toolkit": {"image": "nvcr.io/t@sha256:xyz"}}, "spec.toolkit.image", "not a valid image"),
        ({"driver": {"manager": {"repository": "Nvidia/X"}}}, "spec.driver.manager.repository", "repository"),
        ({"driver": {"manager": {"image": "m", "repository": "r"}}}, "spec.driver.manager", "version"),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "10x"}}},
            "spec.daemonsets.rollingUpdate.maxUnavailable",
            "'10x'",
        ),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": -1}}},
            "spec.daemonsets.rollingUpdate.maxUnavailable",
            "from 0 to",
        ),
        (
            {"driver": {"upgradePolicy": {"maxUnavailable": "101%"}}},
            "spec.driver.upgradePolicy.maxUnavailable",
            "100%",
        ),
        (
            {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}},
            "spec.driver.upgradePolicy.maxParallelUpgrades",
            "0",
        ),
        ({"dcgm": {"hostPort": 0}}, "spec.dcgm.hostPort", "1"),
        ({"dcgm": {"hostPort": 65536}}, "spec.dcgm.hostPort", "65535"),
        (
            {"driver": {"resources": {"limits": {"cpu": "-1"}}}},
            "spec.driver.resources.limits.cpu",
            "quantity",
        ),
        ({"toolkit": {"env": [{"value": "x"}]}}, "spec.toolkit.env[0].name", "required"),
        ({"cdi": {"enabled": False, "nriPluginEnabled": True}}, "spec", "requires cdi.enabled"),
        ({"daemonsets": {"updateStrategy": "Recreate"}}, "spec.daemonsets.updateStrategy", "RollingUpdate"),
        (
            {"daemonsets": {"tolerations": [{"operator": "Maybe"}]}},
            "spec.daemonsets.tolerations[0].operator",
            "Exists",
        ),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, Any], path: str, fragment: str) -> None:
    found = errors(spec)
    assert path in found, found
    assert fragment in found[path]


def test_one_error_per_field_even_for_unions() -> None:
    found = errors({"driver": {"upgradePolicy": {"maxUnavailable": 1.5}}})
    assert list(found) == ["spec.driver.upgradePolicy.maxUnavailable"]


def test_deprecated_alias_still_works() -> None:
    with pytest.warns(DeprecationWarning):
        assert (
            parse_spec({"dcgmExporter": {"serviceMonitoring": True}}).dcgmExporter.serviceMonitoring is True
        )
    spec = parse_spec({"dcgmExporter": {"serviceMonitoring": True, "serviceMonitor": {"enabled": False}}})
    assert spec.dcgmExporter.service_monitor_enabled() is False


def test_unsupported_sections_are_reported() -> None:
    spec = parse_spec(
        {
            "ccManager": {"enabled": True},
            "sandboxWorkloads": {"enabled": True},
            "kataManager": {"enabled": True},
        }
    )
    assert spec.unsupported_enabled() == ["kataManager"]
    # A sandbox section means nothing without sandboxWorkloads.
    assert parse_spec({"kataManager": {"enabled": True}}).unsupported_enabled() == []


def test_gds_and_gdrcopy_need_a_driver_built_on_the_node() -> None:
    assert parse_spec({"gds": {"enabled": True}, "gdrcopy": {"enabled": True}}).unsupported_enabled() == []
    with pytest.raises(PolicyError, match=r"gds\.enabled is not supported with driver\.usePrecompiled"):
        parse_spec({"gds": {"enabled": True}, "driver": {"usePrecompiled": True}})


# --- pydantic and the CRD say the same thing ---------------------------------------------------------

_INT_OR_PERCENT_TEXT = st.text(alphabet="0123456789%x+- \n", max_size=6) | st.sampled_from(
    ["0%", "100%", "101%", "007%", "0100%", "25%", "1\n", "\u0663", "10"]
)


@given(_INT_OR_PERCENT_TEXT | st.integers(min_value=-5, max_value=10**6))
def test_int_or_percent_agrees_with_crd(value: int | str) -> None:
    node = crd_node("daemonsets.rollingUpdate.maxUnavailable")
    if isinstance(value, int):
        by_crd = value >= node["minimum"]
    else:
        by_crd = re.fullmatch(node["pattern"], value) is not None
    # The admission rule of rollingUpdate: never zero (a DaemonSet could not roll).
    rule = crd_node("daemonsets.rollingUpdate")["x-kubernetes-validations"][0]["rule"]
    assert "'^0+%?$'" in rule
    by_crd = by_crd and not re.fullmatch(r"0+%?", str(value))
    assert accepts({"daemonsets": {"rollingUpdate": {"maxUnavailable": value}}}) == by_crd


@given(
    st.text(alphabet="0123456789.+-eEKMGTPkmnui \n", max_size=6)
    | st.sampled_from(["500m", "1Gi", "1.5", ".5", "1e3", "1E-2", "+1", "-1", "1Ki", "1k", "1K", "0Ei"])
)
def test_quantity_agrees_with_crd(value: str) -> None:
    node = crd_node("driver.resources.limits.*")
    by_crd = re.fullmatch(node["pattern"], value) is not None
    # The amount a node can hold is the operator's check (the CRD cannot compare quantities).
    within = by_crd and quantity_value(value) <= CPU_MAX
    assert accepts({"driver": {"resources": {"limits": {"cpu": value}}}}) == within


_IMAGE_TEXT = st.text(alphabet="abcAB01:/._-@é \n", max_size=12) | st.sampled_from(
    ["nvcr.io/nvidia/driver:550", "driver", "nvidia/driver", "my_image", "localhost:5000/a/b", "a//b"]
)


@given(_IMAGE_TEXT)
def test_image_and_repository_agree_with_crd(value: str) -> None:
    image = re.compile(crd_node("toolkit.image")["pattern"], re.ASCII)  # RE2: \w is ASCII
    repository = re.compile(crd_node("toolkit.repository")["pattern"], re.ASCII)  # RE2: \w is ASCII
    version = re.compile(crd_node("toolkit.version")["pattern"], re.ASCII)  # RE2: \w is ASCII
    # RE2 (the API server) has no multi-line `$`; `search` with `^...$` alternatives is the same here as long
    # as no value contains a newline before its end, which is what the pydantic side must reject too.
    assert accepts({"toolkit": {"image": value}}) == (image.search(value) is not None and "\n" not in value)
    assert accepts({"toolkit": {"repository": value, "image": "t", "version": "v1"}}) == (
        repository.search(value) is not None and "\n" not in value
    )
    assert accepts({"toolkit": {"image": "t", "version": value}}) == (
        version.search(value) is not None and "\n" not in value
    )


def _cel_matches(rule: str) -> re.Pattern[str]:
    """The regular expression of a rule's `matches('...')`, its CEL string escapes undone."""
    found = re.search(r"matches\('(.*)'\)", rule)
    assert found, rule
    return re.compile(found.group(1).replace("\\\\", "\\"), re.ASCII)


def _cel_image_rules(fields: dict[str, str]) -> bool:
    """The ComponentSpec CEL rules of the CRD, spelled in Python, with the fields' own patterns."""
    rules = [r["rule"] for r in crd_node("driver")["x-kubernetes-validations"]]
    assert rules[:2] == [
        "!has(self.repository) || (has(self.image) && has(self.version))",
        "!has(self.version) || has(self.image)",
    ]
    assert rules[2].startswith("!has(self.repository) || !has(self.image) || self.image.matches(")
    assert rules[3].startswith(
        "has(self.repository) || !has(self.version) || !has(self.image) || self.image.matches("
    )
    assert (
        rules[4]
        == "!has(self.repository) || !has(self.image) || size(self.repository) + size(self.image) < 255"
    )
    path, name = _cel_matches(rules[2]), _cel_matches(rules[3])
    for field, value in fields.items():
        node = crd_node(f"driver.{field}")
        if not re.search(node["pattern"], value, re.ASCII) or len(value) > node["maxLength"] or "\n" in value:
            return False
    repository, image, version = (fields.get(k) for k in ("repository", "image", "version"))
    return (
        (repository is None or (image is not None and version is not None))
        and (version is None or image is not None)
        and (repository is None or image is None or path.search(image) is not None)
        and (repository is not None or version is None or image is None or name.search(image) is not None)
        and (repository is None or image is None or len(repository) + len(image) < 255)
    )


@pytest.mark.parametrize("present", list(itertools.product([False, True], repeat=3)))
def test_image_triple_rule_agrees_with_cel(present: tuple[bool, bool, bool]) -> None:
    values = {"repository": "nvcr.io/nvidia", "image": "driver", "version": "550.1"}
    fields = {name: value for (name, value), keep in zip(values.items(), present, strict=True) if keep}
    assert accepts({"driver": fields}) == _cel_image_rules(fields)


_REPOSITORIES = ["nvcr.io/nvidia", "nvidia", "localhost:5000", "Reg.io/Nvidia", "a" * 250, "[::1]:5000/x"]
_IMAGES = ["driver", "nvidia/driver", "driver:1", "nvcr.io/nvidia/driver", "a" * 10, "d@sha256:" + "a" * 64]
_VERSIONS = ["550.1", "sha256:" + "b" * 64, "sha512:" + "b" * 128, ".v1", "x" * 129]


@given(
    st.sampled_from([None, *_REPOSITORIES]),
    st.sampled_from([None, *_IMAGES]),
    st.sampled_from([None, *_VERSIONS]),
)
def test_image_fields_agree_with_cel(repository: str | None, image: str | None, version: str | None) -> None:
    values = {"repository": repository, "image": image, "version": version}
    fields = {name: value for name, value in values.items() if value is not None}
    assert accepts({"driver": fields}) == _cel_image_rules(fields)
    assert accepts({"driver": {"manager": fields}}) == _cel_image_rules(fields)


@pytest.mark.parametrize("enabled", [None, False, True])
@pytest.mark.parametrize("nri", [None, False, True])
def test_nri_rule_agrees_with_cel(enabled: bool | None, nri: bool | None) -> None:
    (rule,) = crd_node("cdi")["x-kubernetes-validations"]
    assert (
        rule["rule"]
        == "!has(self.nriPluginEnabled) || !self.nriPluginEnabled || !has(self.enabled) || self.enabled"
    )
    cdi = {k: v for k, v in {"enabled": enabled, "nriPluginEnabled": nri}.items() if v is not None}
    # The server applies the leaf defaults (enabled: true, nriPluginEnabled: false) before CEL runs.
    defaulted = {"enabled": True, "nriPluginEnabled": False, **cdi}
    by_cel = not defaulted["nriPluginEnabled"] or defaulted["enabled"]
    assert accepts({"cdi": cdi}) == by_cel


@given(st.text(alphabet="aZ09._- =\n$é", max_size=6))
def test_env_name_agrees_with_crd(value: str) -> None:
    pattern = crd_node("toolkit.env")["items"]["properties"]["name"]["pattern"]
    by_crd = re.fullmatch(pattern, value) is not None and "\n" not in value
    assert accepts({"toolkit": {"env": [{"name": value, "value": "x"}]}}) == by_crd


def test_fields_accepted_but_not_acted_on_are_reported() -> None:
    assert parse_spec({}).ignored_fields() == []
    spec = parse_spec(
        {
            "driver": {"upgradePolicy": {"autoUpgrade": True}, "useOpenKernelModules": True},
            "operator": {"labels": {"a": "b"}},
            "psp": {"enabled": True},
            "validator": {"vfioPCI": {"env": [{"name": "A", "value": "1"}]}},
        }
    )
    assert [line.split(":")[0] for line in spec.ignored_fields()] == [
        "spec.driver.useOpenKernelModules",
        "spec.operator.labels",
        "spec.psp.enabled",
        "spec.validator.vfioPCI.env",
    ]
    # What the operator does act on is never listed, however it is set.
    acted_on = {"driver": {"upgradePolicy": {"autoUpgrade": True}}, "operator": {"defaultRuntime": "crio"}}
    assert parse_spec(acted_on).ignored_fields() == []


# --- what the API server would refuse or mangle, refused here first with the field's path -----------

INT32_OVER = 2**31

LIMITS = [
    ({"operator": {"runtimeClass": "Not A Valid Name"}}, "spec.operator.runtimeClass", "DNS-1123 label"),
    ({"operator": {"runtimeClass": "a" * 64}}, "spec.operator.runtimeClass", "at most 63"),
    ({"operator": {"runtimeClass": "nvidia.v2"}}, "spec.operator.runtimeClass", "DNS-1123 label"),
    ({"daemonsets": {"priorityClassName": "No_Such"}}, "spec.daemonsets.priorityClassName", "DNS-1123"),
    ({"daemonsets": {"priorityClassName": "a" * 254}}, "spec.daemonsets.priorityClassName", "253"),
    ({"driver": {"imagePullSecrets": ["Bad Name"]}}, "spec.driver.imagePullSecrets[0]", "DNS-1123"),
    ({"devicePlugin": {"config": {"name": "Bad!"}}}, "spec.devicePlugin.config.name", "DNS-1123"),
    (
        {"devicePlugin": {"config": {"name": "c", "default": "a b"}}},
        "spec.devicePlugin.config.default",
        "key",
    ),
    ({"driver": {"licensingConfig": {"secretName": "x y"}}}, "spec.driver.licensingConfig.secretName", "DNS"),
    ({"driver": {"secretEnv": "UPPER"}}, "spec.driver.secretEnv", "DNS-1123"),
    ({"migManager": {"gpuClientsConfig": {"name": "-x"}}}, "spec.migManager.gpuClientsConfig.name", "DNS"),
    (
        {"driver": {"startupProbe": {"initialDelaySeconds": 4294967301}}},
        "spec.driver.startupProbe.initialDelaySeconds",
        "2147483647",
    ),
    (
        {"driver": {"livenessProbe": {"periodSeconds": INT32_OVER}}},
        "spec.driver.livenessProbe.periodSeconds",
        "",
    ),
    (
        {"driver": {"upgradePolicy": {"drain": {"timeoutSeconds": INT32_OVER}}}},
        "spec.driver.upgradePolicy.drain.timeoutSeconds",
        "2147483647",
    ),
    (
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": INT32_OVER}}},
        "spec.daemonsets.rollingUpdate.maxUnavailable",
        "2147483647",
    ),
    (
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": "4294967301"}}},
        "spec.daemonsets.rollingUpdate.maxUnavailable",
        "percentage",
    ),
    (
        {"daemonsets": {"tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 2**63}]}},
        "spec.daemonsets.tolerations[0].tolerationSeconds",
        "",
    ),
    ({"daemonsets": {"tolerations": [{"key": "a b"}]}}, "spec.daemonsets.tolerations[0].key", "label key"),
    ({"hostPaths": {"driverInstallDir": "/"}}, "spec.hostPaths.driverInstallDir", "root directory"),
    ({"hostPaths": {"driverInstallDir": "//./"}}, "spec.hostPaths.driverInstallDir", "root directory"),
    ({"hostPaths": {"driverInstallDir": "run/nvidia"}}, "spec.hostPaths.driverInstallDir", "absolute"),
    ({"hostPaths": {"kubeletRootDir": "/var/../etc"}}, "spec.hostPaths.kubeletRootDir", "'..'"),
    ({"hostPaths": {"rootFS": "host"}}, "spec.hostPaths.rootFS", "absolute"),
    ({"toolkit": {"installDir": "/"}}, "spec.toolkit.installDir", "root directory"),
    ({"devicePlugin": {"mps": {"root": "mps"}}}, "spec.devicePlugin.mps.root", "absolute"),
    (
        {"daemonsets": {"podSecurityContext": {"runAsUser": "root"}}},
        "spec.daemonsets.podSecurityContext.runAsUser",
        "integer",
    ),
    (
        {"daemonsets": {"podSecurityContext": {"runAsUser": -1}}},
        "spec.daemonsets.podSecurityContext.runAsUser",
        "0",
    ),
    (
        {"daemonsets": {"podSecurityContext": {"fsGroup": INT32_OVER}}},
        "spec.daemonsets.podSecurityContext.fsGroup",
        "2147483647",
    ),
    (
        {"daemonsets": {"podSecurityContext": {"runAsUsr": 0}}},
        "spec.daemonsets.podSecurityContext.runAsUsr",
        "unknown field",
    ),
    (
        {"daemonsets": {"podSecurityContext": {"seccompProfile": {"type": "Strict"}}}},
        "spec.daemonsets.podSecurityContext.seccompProfile.type",
        "RuntimeDefault",
    ),
    ({"daemonsets": {"labels": {"team": "not valid!"}}}, "spec.daemonsets.labels", "label value"),
    ({"daemonsets": {"labels": {"team": "x" * 64}}}, "spec.daemonsets.labels", "63"),
    (
        {"daemonsets": {"annotations": {"big": "x" * (256 * 1024)}}},
        "spec.daemonsets.annotations",
        "262144",
    ),
    ({"kataManager": {"config": {f"k{i}": i for i in range(65)}}}, "spec.kataManager.config", "64 keys"),
    ({"kataManager": {"config": {"s": "x" * 4097}}}, "spec.kataManager.config", "4096"),
    ({"kataManager": {"config": {"l": list(range(1001))}}}, "spec.kataManager.config", "1000"),
    (
        {"dcgmExporter": {"serviceMonitor": {"relabelings": [{}] * 65}}},
        "spec.dcgmExporter.serviceMonitor.relabelings",
        "64",
    ),
    (
        {"dcgmExporter": {"serviceMonitor": {"interval": "15 seconds"}}},
        "spec.dcgmExporter.serviceMonitor.interval",
        "duration",
    ),
    # The API server reads a quantity's exponent as an int64 and refuses a longer one.
    (
        {"driver": {"resources": {"limits": {"cpu": "1e9223372036854775808"}}}},
        "spec.driver.resources.limits.cpu",
        "64-bit",
    ),
    (
        {"driver": {"resources": {"limits": {"cpu": "1E" + "9" * 5000}}}},
        "spec.driver.resources.limits.cpu",
        "longer than 64 characters",
    ),
    # Exponents the default decimal context cannot raise 10 to (found by test_crd_properties): more
    # than any node holds.
    (
        {"ccManager": {"resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1e1000000"}}}},
        "spec.ccManager.resources.requests",
        "more than a node can hold",
    ),
    (
        {"ccManager": {"resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1e3"}}}},
        "spec.ccManager.resources",
        "more than limits.cpu",
    ),
]


@pytest.mark.parametrize(("spec", "path", "fragment"), LIMITS, ids=[p for _, p, _ in LIMITS])
def test_limits_name_the_field(spec: dict[str, Any], path: str, fragment: str) -> None:
    found = errors(spec)
    assert path in found, found
    assert fragment in found[path]


@pytest.mark.parametrize(
    "spec",
    [
        {"operator": {"runtimeClass": "nvidia-cdi"}},
        {"daemonsets": {"priorityClassName": "no-such-priority-class"}},
        {"daemonsets": {"podSecurityContext": {"runAsUser": 0, "runAsNonRoot": False, "fsGroup": 2**31 - 1}}},
        {
            "daemonsets": {
                "labels": {"team": ""},
                "tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 2**63 - 1}],
            }
        },
        {"hostPaths": {"rootFS": "/", "driverInstallDir": "/opt/nvidia/driver/", "kubeletRootDir": "/k"}},
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": 2**31 - 1}}},
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": "999999999"}}},
        {"kataManager": {"config": {"artifactsDir": "/opt", "runtimeClasses": [{"name": "kata"}]}}},
        {"dcgmExporter": {"serviceMonitor": {"interval": "1m30s", "relabelings": [{"action": "drop"}]}}},
        {"ccManager": {"resources": {"limits": {"cpu": 0}, "requests": {"cpu": ".0E1000000"}}}},
        {
            "driver": {
                "resources": {
                    "limits": {"cpu": "1e6", "example.com/widget": "9223372036854775807"},
                    "requests": {"cpu": "1e-000000000000000000000009"},
                }
            }
        },
    ],
)
def test_limits_leave_valid_values_alone(spec: dict[str, Any]) -> None:
    assert accepts(spec)


def nested(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {}
    for _ in range(depth):
        inner = {"a": inner}
    return inner


@pytest.mark.parametrize("depth", [40, 2000, 50000])
def test_deep_nesting_is_reported_with_its_path(depth: int) -> None:
    found = errors({"kataManager": {"config": nested(depth)}})
    ((path, message),) = found.items()
    assert path.startswith("spec.kataManager.config.a.a")
    assert message == "nested more than 32 levels deep"


def test_nesting_up_to_the_limit_is_fine() -> None:
    assert accepts({"kataManager": {"config": nested(28)}})


# Each host-path rule of the CRD (CEL), spelled in Python, must say what the model says.
def _cel_host_dir(value: str) -> bool:
    absolute = value.startswith("/") and "/../" not in value and not value.endswith("/..")
    return absolute and re.fullmatch(r"(/\.?)+", value) is None


@given(st.text(alphabet="/.a", max_size=8))
def test_host_dir_rules_agree_with_cel(value: str) -> None:
    node = crd_node("hostPaths.driverInstallDir")
    rules = [r["rule"] for r in node["x-kubernetes-validations"]]
    assert rules == [
        "self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')",
        "!self.matches('^(/\\\\.?)+$')",
    ]
    assert accepts({"hostPaths": {"driverInstallDir": value}}) == _cel_host_dir(value)


@given(st.text(alphabet="aZ09.-_ ", max_size=70))
def test_name_patterns_agree_with_crd(value: str) -> None:
    for dotted, field in (
        ("operator.runtimeClass", {"operator": {"runtimeClass": value}}),
        ("daemonsets.priorityClassName", {"daemonsets": {"priorityClassName": value}}),
    ):
        node = crd_node(dotted)
        by_crd = re.fullmatch(node["pattern"], value) is not None and len(value) <= node["maxLength"]
        assert accepts(field) == by_crd, dotted


# --- empty means unset ----------------------------------------------------------------------------


def test_empty_lists_and_maps_are_unset_as_for_nvidia() -> None:
    # NVIDIA's Helm values write these empty; its operator acts on them only when they have content.
    spec = parse_spec(
        {
            "daemonsets": {"tolerations": [], "labels": {}, "annotations": {}},
            "devicePlugin": {"args": [], "env": [], "imagePullSecrets": [], "resources": {}},
            "validator": {"resources": {"limits": {}, "requests": {}}, "plugin": {"env": []}},
            "driver": {"manager": {"env": []}},
            "dcgmExporter": {"serviceMonitor": {"additionalLabels": {}, "relabelings": []}},
            "kataManager": {"config": {}},
        }
    )
    assert spec.daemonsets.tolerations is None
    assert spec.daemonsets.labels is None and spec.daemonsets.annotations is None
    plugin = spec.devicePlugin
    assert (plugin.args, plugin.env, plugin.imagePullSecrets, plugin.resources) == (None, None, None, None)
    assert spec.validator.resources is None
    assert spec.validator.plugin is not None and spec.validator.plugin.env is None
    assert spec.driver.manager is not None and spec.driver.manager.env is None
    monitor = spec.dcgmExporter.serviceMonitor
    assert monitor is not None and (monitor.additionalLabels, monitor.relabelings) == (None, None)
    assert spec.kataManager.config is None
    # Empty is the same policy as absent, so it is also rendered the same.
    assert spec == parse_spec(
        {
            "devicePlugin": {},
            "validator": {"plugin": {}},
            "driver": {"manager": {}},
            "dcgmExporter": {"serviceMonitor": {}},
        }
    )


def test_content_is_kept_and_still_checked() -> None:
    spec = parse_spec({"devicePlugin": {"args": [""], "resources": {"limits": {"cpu": "1"}, "requests": {}}}})
    assert spec.devicePlugin.args == [""]
    assert spec.devicePlugin.resources is not None
    assert spec.devicePlugin.resources.limits == {"cpu": "1"} and spec.devicePlugin.resources.requests is None
    with pytest.raises(PolicyError, match=r"spec\.devicePlugin\.args: Input should be a valid list"):
        parse_spec({"devicePlugin": {"args": {}}})


def test_an_empty_canary_selector_keeps_its_meaning() -> None:
    # Our extension: nodeSelector {} selects every GPU node, which is not what leaving it out means.
    policy: dict[str, Any] = {"driver": {"upgradePolicy": {"canary": {"nodeSelector": {}}}}}
    upgrade = parse_spec(policy).driver.upgradePolicy
    assert upgrade is not None and upgrade.canary is not None and upgrade.canary.nodeSelector == {}
    with pytest.raises(PolicyError, match="canary needs nodeSelector, count or both"):
        parse_spec({"driver": {"upgradePolicy": {"canary": {}}}})


# --- images without a registry --------------------------------------------------------------------


def test_images_without_a_registry_host_are_named() -> None:
    spec = parse_spec(
        {
            "devicePlugin": {"repository": "nvidia", "image": "k8s-device-plugin", "version": "v0.20.0"},
            "validator": {"image": "busybox"},
            "driver": {"manager": {"image": "driver-manager", "version": "sha256:" + "a" * 64}},
            "toolkit": {"image": "localhost/nvidia/container-toolkit", "version": "v1"},
            "gfd": {"image": "REGISTRY/nvidia/gfd:v1"},  # capitals: a host, as the runtimes read it
            "dcgm": {"image": "[::1]:5000/dcgm"},
            "migManager": {"enabled": False, "image": "nvidia/k8s-mig-manager:v1"},  # not deployed
            "sandboxDevicePlugin": {"enabled": True, "image": "nvidia/kubevirt-gpu-device-plugin:v1"},
        }
    )
    found = [line.split(": ", 1)[0] for line in spec.images_without_registry()]
    assert found == ["spec.validator.image", "spec.devicePlugin.repository", "spec.driver.manager.image"]
    text = "\n".join(spec.images_without_registry())
    assert "pulls docker.io/library/busybox;" in text
    assert "pulls docker.io/nvidia/k8s-device-plugin:v0.20.0;" in text
    assert f"pulls docker.io/library/driver-manager@sha256:{'a' * 64};" in text
    assert parse_spec({}).images_without_registry() == []
    assert (
        parse_spec({"driver": {"enabled": False, "manager": {"image": "m"}}}).images_without_registry() == []
    )


def test_values_are_quoted_by_their_start_and_length() -> None:
    assert quoted("short") == "'short'"
    assert quoted("a" * 2**20) == f"{'a' * 40 + '…'!r} (1048576 characters)"
    assert quoted(10**5000) == "an integer of about 5001 digits"  # str() would raise ValueError
    assert quoted(12) == "12" and quoted(None) == "None" and quoted(True) == "True"
    assert quoted(["x"] * 100).endswith("(500 characters)")


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"daemonsets": {"labels": {"team": "b" * 2**20}}}, "spec.daemonsets.labels"),
        ({"driver": {"upgradePolicy": {"drain": {"podSelector": "a=(" * 1000}}}}, "spec.driver"),
        ({"hostPaths": {"rootFS": "x" * 4000}}, "spec.hostPaths.rootFS"),
        ({"driver": {"image": "Bad Image " * 400}}, "spec.driver.image"),
    ],
    ids=["label-value", "selector", "host-path", "image"],
)
def test_a_refused_value_is_never_quoted_whole(spec: dict[str, Any], path: str) -> None:
    found = errors(spec)
    assert any(p.startswith(path) for p in found), found
    assert all(len(message) < 400 for message in found.values()), found
