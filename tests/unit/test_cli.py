"""`gpu-operator validate | render | crd | run`, called through `main()` as the console script does."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import node_body

from gpu_operator import cli
from gpu_operator.api import parse_spec
from gpu_operator.api.crd import GPU_CLUSTER, NVIDIA_DRIVER, crd_yaml, definition_yaml
from gpu_operator.core.components import COMPONENTS

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
INVALID = sorted((DATA / "invalid").glob("*.yaml"))
SEED = DATA / "policies" / "seed-sample.yaml"
TEMPLATES = Path(__file__).resolve().parents[2] / "manifests" / "templates"
DRIVER_SAMPLES = sorted((DATA / "nvidia").glob("nvidiadriver-*.yaml"))

HEADER = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  name: cluster-policy\n"
NODE_OS = {
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "feature.node.kubernetes.io/pci-10de.present": "true",
}

# Nine levels of nine aliases each: 387 420 489 strings once expanded, from 14 short lines.
LAUGHS = (
    HEADER
    + "spec:\n  driver:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"    {name}: &{name} [{', '.join([f'*{before}'] * 9)}]\n"
        for before, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
)

needs_seed = pytest.mark.skipif(
    not SEED.exists(), reason="tests/data/policies/seed-sample.yaml not there yet"
)
needs_templates = pytest.mark.skipif(
    not any((TEMPLATES / "driver").glob("*")), reason="component templates not there yet"
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err


def policy_file(tmp_path: Path, spec: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + spec, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _no_image_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for component in COMPONENTS:
        monkeypatch.delenv(component.image_env, raising=False)


# --- validate --------------------------------------------------------------------------------------


def test_empty_spec_is_valid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "validate", "-f", str(policy_file(tmp_path, "spec: {}\n")))
    assert code == 0
    assert out.startswith("cluster-policy: valid (driver, container-toolkit, ")
    assert out.count("\n") == 1
    assert err == ""


def test_policy_without_spec_is_valid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, _ = run(capsys, "validate", "-f", str(policy_file(tmp_path, "")))
    assert code == 0


@needs_seed
def test_seed_sample_is_refused_for_its_images_without_a_registry(capsys: pytest.CaptureFixture[str]) -> None:
    # The API server and NVIDIA's operator accept it, but four of its images would be pulled from
    # Docker Hub, where NVIDIA publishes none: every field is named, and validate exits 2.
    code, out, err = run(capsys, "validate", "-f", str(SEED))
    assert code == 2
    assert out == ""
    assert "warning: spec.dcgmExporter.serviceMonitoring is deprecated" in err
    fields = [
        "spec.validator.image",
        "spec.toolkit.image",
        "spec.devicePlugin.image",
        "spec.dcgmExporter.image",
    ]
    assert [line.split(": ")[2] for line in err.splitlines() if "registry" in line] == fields
    assert (
        "spec.validator.image: 'nvidia/cloud-native/k8s-logical-edge-validator:v22.10.0' names no "
        "registry host, so a container runtime pulls "
        "docker.io/nvidia/cloud-native/k8s-logical-edge-validator:v22.10.0"
    ) in err
    assert "spec.driver" not in err  # repository: nvcr.io


def test_the_example_names_its_registries(capsys: pytest.CaptureFixture[str]) -> None:
    # The seed sample as `make demo` applies it: the same policy with every registry named.
    code, out, err = run(capsys, "validate", "-f", str(REPO / "examples" / "clusterpolicy.yaml"))
    assert code == 0
    assert ": valid (" in out and "1 deprecated field: spec.dcgmExporter.serviceMonitoring" in out
    assert "registry" not in err


def test_the_example_nvidiadrivers_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    # The pools of docs/nvidiadriver.md: one default, two selected by a label.
    code, out, err = run(capsys, "validate", "-f", str(REPO / "examples" / "nvidiadrivers.yaml"))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "nvidiadriver/default: valid (gpu driver 595.91.07; default: every GPU node no other NVIDIADriver "
        "selects)",
        "nvidiadriver/lts: valid (gpu driver 580.95.05; GPU nodes with driver-pool=lts)",
        "nvidiadriver/precompiled: valid (gpu driver 595, precompiled; GPU nodes with "
        "driver-pool=precompiled)",
    ]


def test_render_warns_of_images_without_a_registry(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(
        capsys, "render", "-f", str(policy_file(tmp_path, "spec:\n  validator:\n    image: busybox\n"))
    )
    assert code == 0 and "kind: DaemonSet" in out
    assert "warning: spec.validator.image: 'busybox' names no registry host" in err


def test_images_with_a_registry_do_not_warn(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = (
        "spec:\n  validator:\n    image: localhost:5000/validator:v1\n"
        "  toolkit:\n    repository: registry.local/nvidia\n    image: container-toolkit\n    version: v1\n"
        "  gds:\n    repository: nvidia\n    image: nvidia-fs\n    version: '2.1'\n"
    )
    code, out, err = run(capsys, "validate", "-f", str(policy_file(tmp_path, spec)))
    assert code == 0
    assert "registry" not in out and err == ""  # gds is off: its image is never pulled


def test_deprecated_and_unsupported_fields_warn(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = (
        "spec:\n  driver:\n    useOpenKernelModules: true\n  kataManager:\n    enabled: true\n"
        "  sandboxWorkloads:\n    enabled: true\n"
    )
    code, out, err = run(capsys, "validate", "-f", str(policy_file(tmp_path, spec)))
    assert code == 0
    assert "1 deprecated field: spec.driver.useOpenKernelModules" in out
    assert "1 unsupported section enabled: kataManager" in out
    assert "warning: spec.driver.useOpenKernelModules is deprecated" in err
    assert "warning: spec.kataManager is enabled, but NVIDIA deprecated the Kata manager" in err
    assert "warning: accepted but not acted on: spec.driver.useOpenKernelModules: deprecated" in err


def test_disabled_components_are_not_listed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = "spec:\n  driver:\n    enabled: false\n  nodeStatusExporter:\n    enabled: true\n"
    _, out, _ = run(capsys, "validate", "-f", str(policy_file(tmp_path, spec)))
    assert "(container-toolkit, " in out
    assert "node-status-exporter enabled" in out


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_inputs(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    expected = path.read_text(encoding="utf-8").splitlines()[0].removeprefix("# expect: ")
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert code == 2
    assert out == ""
    assert expected in err
    assert all(line.startswith(f"{path}: ") for line in err.splitlines()), err


def test_each_error_on_its_own_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = "spec:\n  driver:\n    foo: 1\n    enabled: 'yes'\n  mig:\n    strategy: double\n"
    code, _, err = run(capsys, "validate", "-f", str(policy_file(tmp_path, spec)))
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 3
    assert {line.split(": ")[1] for line in lines} == {
        "spec.driver.foo",
        "spec.driver.enabled",
        "spec.mig.strategy",
    }


def test_multi_document_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        f"{HEADER}spec: {{}}\n---\n---\n{HEADER.replace('cluster-policy', 'second')}", encoding="utf-8"
    )
    code, out, _ = run(capsys, "validate", "-f", str(path))
    assert code == 0
    assert [line.split(":")[0] for line in out.splitlines()] == ["cluster-policy", "second"]


def test_list_of_policies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    policy = yaml.safe_load(HEADER + "spec: {}\n")
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [policy]}), encoding="utf-8")
    code, out, _ = run(capsys, "validate", "-f", str(path))
    assert code == 0
    assert out.startswith("cluster-policy: valid")


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((HEADER + "spec: {}\n").encode())))
    code, out, _ = run(capsys, "validate", "-f", "-")
    assert code == 0
    assert out.startswith("cluster-policy: valid")


def test_stdin_errors_name_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"spec: [")))
    code, _, err = run(capsys, "validate", "-f", "-")
    assert code == 2
    assert err.startswith("<stdin>: line ")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("dir", "is a directory"),
        (b"\xff\xfe\x00spec", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"---\n---\n", "empty"),
        (b"\t- x", "not valid YAML"),
        (b"spec: {a: 1, a: [}", "not valid YAML"),
        (b"? [a, b]\n: c\n", "not valid YAML"),
        (b"[" * 5000 + b"]" * 5000, "YAML"),
        ((HEADER + "spec: &x\n  driver: *x\n").encode(), "spec.driver"),
        (LAUGHS.encode(), "line 13, column 8: not usable YAML: stands for more than 1000000 values"),
        (
            (HEADER + "spec:\n  driver:\n    startupProbe:\n      periodSeconds: " + "9" * 5000).encode(),
            "line 8, column 22: not usable YAML: an integer of 5000 digits",
        ),
        (
            (HEADER + "spec:\n  driver:\n    startupProbe:\n      periodSeconds: " + "9" * 4000).encode(),
            "spec.driver.startupProbe.periodSeconds: Input should be less than or equal to 2147483647",
        ),
    ],
    ids=[
        "missing",
        "directory",
        "binary",
        "only-separators",
        "tab",
        "syntax",
        "unhashable-key",
        "deep",
        "cyclic-alias",
        "billion-laughs",
        "integer-python-cannot-read",
        "integer-too-large-for-its-field",
    ],
)
def test_unusable_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes | str | None, expected: str
) -> None:
    path = tmp_path / "input.yaml"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert code == 2
    assert out == ""
    assert expected in err
    assert len(err.splitlines()) >= 1


def test_aliases_that_stay_small_are_fine() -> None:
    text = HEADER + "spec:\n  daemonsets:\n    labels: &l {team: a}\n  driver:\n    x: *l\n"
    (doc,) = cli.load_documents(text)
    assert doc["spec"]["driver"]["x"] == {"team": "a"}
    assert cli.load_documents("a: &a [1, 2]\nb: [*a, *a, *a]\n") == [{"a": [1, 2], "b": [[1, 2]] * 3}]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["validate"]) == 2
    assert cli.main(["frobnicate"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "validate" in capsys.readouterr().out


# --- crd -------------------------------------------------------------------------------------------


def test_crd_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "crd")
    assert code == 0
    assert out == crd_yaml()
    assert err == ""


def test_crd_prints_each_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "crd", "clusterpolicy") == (0, crd_yaml(), "")
    assert run(capsys, "crd", "nvidiadriver") == (0, definition_yaml(NVIDIA_DRIVER), "")
    assert run(capsys, "crd", "gpucluster") == (0, definition_yaml(GPU_CLUSTER), "")
    code, out, err = run(capsys, "crd", "gpuclusters")
    assert (code, out) == (2, "")
    assert "invalid choice" in err


def test_validate_and_crd_do_not_import_kopf() -> None:
    import subprocess

    program = (
        "import sys; from gpu_operator import cli; cli.main(['crd']); "
        "assert 'kopf' not in sys.modules and 'kubernetes_asyncio' not in sys.modules, 'imported'"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


# --- run -------------------------------------------------------------------------------------------


def test_run_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--namespace", "--log-format", "--listen", "--verbose"):
        assert option in out


def test_run_passes_options(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = pytest.importorskip("gpu_operator.main")
    from gpu_operator.runtime.settings import Settings

    calls: list[Settings] = []
    monkeypatch.setattr(operator, "run", calls.append)
    monkeypatch.setenv("OPERATOR_NAMESPACE", "gpu-ops")
    monkeypatch.delenv("GPU_OPERATOR_LISTEN", raising=False)
    monkeypatch.setenv("DRIVER_IMAGE", "example.com/driver:1")
    assert cli.main(["run"]) == 0
    shown = calls[-1]
    assert (shown.namespace, shown.log_format, shown.listen, shown.verbose) == (
        "gpu-ops",
        "plain",
        "0.0.0.0:8080",
        False,
    )
    assert shown.environ["DRIVER_IMAGE"] == "example.com/driver:1"
    monkeypatch.setenv("DRIVER_IMAGE", "changed")
    assert shown.environ["DRIVER_IMAGE"] == "example.com/driver:1", "frozen when the CLI built it"
    monkeypatch.setenv("GPU_OPERATOR_LISTEN", "")
    assert cli.main(["run", "--namespace", "x", "--log-format", "json", "-v"]) == 0
    shown = calls[-1]
    assert (shown.namespace, shown.log_format, shown.listen, shown.verbose) == ("x", "json", "", True)
    assert cli.main(["run", "--listen", "[::1]:0"]) == 0
    assert calls[-1].listen == "[::1]:0"


@pytest.mark.parametrize("address", ["8080", "host:port", "0.0.0.0:70000", "http://0.0.0.0:8080/healthz"])
def test_run_rejects_a_bad_listen_address(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--listen", address]) == 2
    assert "--listen" in capsys.readouterr().err


# --- render ----------------------------------------------------------------------------------------


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def daemonsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}


def images_of(daemonset: dict[str, Any]) -> list[str]:
    pod = daemonset["spec"]["template"]["spec"]
    return [c["image"] for c in pod.get("initContainers", []) + pod["containers"]]


def test_render_reports_validation_errors(capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "invalid" / "unknown-field.yaml"
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (2, "")
    assert f"{path}: spec.driver.foo: unknown field" in err


def test_render_rejects_bad_node_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", encoding="utf-8")
    code, out, err = run(
        capsys, "render", "-f", str(policy_file(tmp_path, "spec: {}\n")), "--nodes", str(nodes)
    )
    assert (code, out) == (2, "")
    assert f"{nodes}: item 1: a ConfigMap, not a Node" in err


@needs_templates
@needs_seed
def test_render_seed_sample(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "-f", str(SEED), "--namespace", "gpu-ops")
    assert code == 0
    objects = documents(out)
    spec = parse_spec(yaml.safe_load(SEED.read_text(encoding="utf-8"))["spec"])
    # Its driver is delegated to NVIDIADrivers (useNvidiaDriverCRD), none of which is in the file.
    expected = [c.daemonset for c in COMPONENTS if c.enabled(spec) and c.name != "driver"]
    assert list(daemonsets(objects)) == expected
    assert all(o["metadata"].get("namespace", "gpu-ops") == "gpu-ops" for o in objects)


@needs_templates
def test_render_applies_the_node_os_to_the_driver_tag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = policy_file(tmp_path, "spec: {}\n")
    node = node_body("gpu-1", NODE_OS, typed=True)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node]}), encoding="utf-8")
    driver = next(c for c in COMPONENTS if c.name == "driver")

    code, out, _ = run(capsys, "render", "-f", str(policy), "--nodes", str(nodes))
    assert code == 0
    tag = f"{driver.default_image.version}-ubuntu22.04"
    assert any(
        image.endswith(f"/driver:{tag}") for image in images_of(daemonsets(documents(out))[driver.daemonset])
    )

    # The same as separate Node documents (`kubectl get node a b -o yaml` prints a List; plain files don't).
    nodes.write_text(yaml.safe_dump_all([node, {**node, "metadata": {"name": "cpu-1"}}]), encoding="utf-8")
    code, out2, _ = run(capsys, "render", "-f", str(policy), "--nodes", str(nodes))
    assert (code, out2) == (0, out)

    code, out3, _ = run(capsys, "render", "-f", str(policy))
    assert code == 0
    assert tag not in out3


@needs_templates
def test_render_reads_image_fallbacks_from_the_environment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTAINER_TOOLKIT_IMAGE", "registry.example/toolkit:v9")
    code, out, _ = run(capsys, "render", "-f", str(policy_file(tmp_path, "spec: {}\n")))
    assert code == 0
    assert "registry.example/toolkit:v9" in images_of(
        daemonsets(documents(out))["nvidia-container-toolkit-daemonset"]
    )


INJECTION = (
    'x"\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: pwned}\n--- |\n  ${{ "}}" }}\'\nkey: [\n'
)


@needs_templates
def test_env_value_cannot_inject_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = yaml.safe_dump({"spec": {"toolkit": {"env": [{"name": "INJECT", "value": INJECTION}]}}})
    policy = policy_file(tmp_path, spec)
    assert cli.main(["validate", "-f", str(policy)]) == 0
    capsys.readouterr()

    code, out, _ = run(capsys, "render", "-f", str(policy))
    assert code == 0
    objects = documents(out)
    _, plain, _ = run(capsys, "render", "-f", str(policy_file(tmp_path, "spec: {}\n", "plain.yaml")))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        (o["kind"], o["metadata"]["name"]) for o in documents(plain)
    ]
    found = [
        env
        for ds in daemonsets(objects).values()
        for container in ds["spec"]["template"]["spec"]["containers"]
        for env in container.get("env", [])
        if env.get("name") == "INJECT"
    ]
    assert found == [{"name": "INJECT", "value": INJECTION}]
    assert not any(o["kind"] == "Namespace" for o in objects)


def node_doc(name: str, runtime: str, kernel: str) -> dict[str, Any]:
    """A Node of `render --nodes`: NODE_OS's labels and this kernel, this container runtime."""
    labels = {**NODE_OS, "feature.node.kubernetes.io/kernel-version.full": kernel}
    return node_body(name, labels, status={"nodeInfo": {"containerRuntimeVersion": runtime}}, typed=True)


@needs_templates
def test_render_for_several_nodes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One toolkit DaemonSet per container runtime, one precompiled driver DaemonSet per kernel."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        yaml.safe_dump_all(
            [node_doc("a", "containerd://1.7", "5.15.0-1"), node_doc("b", "cri-o://1.30", "6.8.0-2")]
        ),
        encoding="utf-8",
    )
    spec = "spec:\n  driver: {usePrecompiled: true, repository: r, image: driver, version: '570'}\n"
    code, out, _ = run(capsys, "render", "-f", str(policy_file(tmp_path, spec)), "--nodes", str(nodes))
    assert code == 0
    names = set(daemonsets(documents(out)))
    assert {
        "nvidia-container-toolkit-daemonset",
        "nvidia-container-toolkit-daemonset-crio",
        "nvidia-driver-daemonset-5.15.0-1-ubuntu22.04",
        "nvidia-driver-daemonset-6.8.0-2-ubuntu22.04",
    } <= names


@needs_templates
def test_render_without_the_config_maps_the_driver_mounts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = policy_file(tmp_path, "spec:\n  driver: {kernelModuleConfig: {name: params}}\n")
    code, out, err = run(capsys, "render", "-f", str(policy))
    assert code == 0
    assert "nvidia-driver-daemonset" not in daemonsets(documents(out))
    assert (
        f"{policy}: warning: spec.driver.kernelModuleConfig.name: ConfigMap 'params' not found in namespace "
        "'gpu-operator'; nvidia-driver-daemonset is left out"
    ) in err

    config_maps = tmp_path / "cm.yaml"
    config_maps.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: params}\ndata: {nvidia.conf: 'NVreg_x=1'}\n",
        encoding="utf-8",
    )
    code, out, err = run(capsys, "render", "-f", str(policy), "--config-maps", str(config_maps))
    assert (code, err) == (0, "")
    driver = daemonsets(documents(out))["nvidia-driver-daemonset"]
    mounts = driver["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": "kernel-module-config",
        "mountPath": "/drivers/nvidia.conf",
        "subPath": "nvidia.conf",
        "readOnly": True,
    } in mounts

    code, _, err = run(capsys, "render", "-f", str(policy), "--config-maps", str(policy))
    assert code == 2
    assert f"{policy}: item 1: a ClusterPolicy, not a ConfigMap" in err


@needs_templates
def test_render_without_the_service_monitor_crd(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    policy = policy_file(tmp_path, "spec:\n  dcgmExporter: {serviceMonitor: {enabled: true}}\n")
    _, out, _ = run(capsys, "render", "-f", str(policy))
    assert any(o["kind"] == "ServiceMonitor" for o in documents(out))
    _, out, _ = run(capsys, "render", "-f", str(policy), "--no-servicemonitor-crd")
    assert not any(o["kind"] == "ServiceMonitor" for o in documents(out))


# --- NVIDIADriver documents ------------------------------------------------------------------------

DRIVER = (
    "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata:\n  name: {name}\nspec:\n"
    "  repository: nvcr.io/nvidia\n  image: driver\n  version: '595.91.07'\n"
)


def driver_doc(name: str = "a100", extra: str = "") -> str:
    return DRIVER.format(name=name) + extra


@pytest.mark.parametrize("path", DRIVER_SAMPLES, ids=[p.stem for p in DRIVER_SAMPLES])
def test_nvidias_driver_samples_validate(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert (code, err) == (0, "")
    assert out.startswith("nvidiadriver/") and ": valid (gpu driver " in out


def test_a_file_may_mix_policies_and_drivers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    selector = "  nodeSelector:\n    nvidia.com/gpu.product: A100-SXM4-80GB\n"
    path.write_text(
        f"{HEADER}spec: {{}}\n---\n{driver_doc('a100', selector)}---\n"
        + driver_doc("fallback", "  default: true\n  usePrecompiled: true\n"),
        encoding="utf-8",
    )
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert (code, err) == (0, "")
    assert out.splitlines()[1:] == [
        "nvidiadriver/a100: valid (gpu driver 595.91.07; GPU nodes with "
        "nvidia.com/gpu.product=A100-SXM4-80GB)",
        "nvidiadriver/fallback: valid (gpu driver 595.91.07, precompiled; default: every GPU node no other "
        "NVIDIADriver selects)",
    ]
    assert out.startswith("cluster-policy: valid (")


def test_driver_errors_name_the_field_and_document(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "drivers.yaml"
    path.write_text(
        driver_doc("ok")
        + "---\n"
        + driver_doc("bad", "  default: true\n  driverType: cuda\n  nodeSelector: {pool: a}\n")
        + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
        encoding="utf-8",
    )
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"{path}: document 2: spec.driverType: Input should be 'gpu', 'vgpu' or 'vgpu-host-manager'",
        f"{path}: document 2: spec.nodeSelector: default NVIDIADriver must not use nodeSelector: the default "
        "driver serves every GPU node no other NVIDIADriver selects",
        f"{path}: document 3: a ConfigMap, not a ClusterPolicy, NVIDIADriver or GPUCluster",
    ]


def test_a_driver_document_is_checked_as_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "driver.yaml"
    path.write_text(
        driver_doc().replace("v1alpha1", "v1").replace("name: a100", "labels: {}"), encoding="utf-8"
    )
    code, _, err = run(capsys, "validate", "-f", str(path))
    assert code == 2
    assert err.splitlines() == [
        f"{path}: apiVersion: must be nvidia.com/v1alpha1, not 'nvidia.com/v1'",
        f"{path}: metadata.name: required field is missing",
    ]


def test_two_default_drivers_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "defaults.yaml"
    default = "  default: true\n"
    path.write_text(f"{driver_doc('one', default)}---\n{driver_doc('two', default)}", encoding="utf-8")
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert code == 2
    assert out.count(": valid (") == 2
    assert err == (
        f"{path}: nvidiadriver/one, nvidiadriver/two: more than one NVIDIADriver is the default "
        "(spec.default: true); NVIDIA's operator then deploys none of them\n"
    )


def test_driver_warnings_name_the_driver(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "driver.yaml"
    extra = "  useOpenKernelModules: true\n  licensingConfig: {name: gridd}\n"
    path.write_text(driver_doc("vgpu", extra), encoding="utf-8")
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert code == 0
    assert "2 deprecated fields: spec.useOpenKernelModules, spec.licensingConfig.name" in out
    lines = err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"{path}: warning: nvidiadriver/vgpu: spec.useOpenKernelModules is deprecated")
    assert lines[1].startswith(f"{path}: warning: nvidiadriver/vgpu: spec.licensingConfig.name is deprecated")
    assert lines[2] == (
        f"{path}: warning: nvidiadriver/vgpu: accepted but not acted on: spec.useOpenKernelModules: "
        "deprecated and ignored, as by NVIDIA's operator; use kernelModuleType: open"
    )


def test_driver_images_without_a_registry_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "driver.yaml"
    path.write_text(driver_doc().replace("nvcr.io/nvidia", "nvidia"), encoding="utf-8")
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"{path}: nvidiadriver/a100: spec.repository: 'nvidia/driver:595.91.07' names no")


def test_render_of_drivers_alone_needs_the_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "driver.yaml"
    path.write_text(driver_doc(), encoding="utf-8")
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (2, "")
    assert err == f"{path}: render needs the ClusterPolicy too: an NVIDIADriver is rendered with it\n"


def test_render_checks_drivers_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    bad = driver_doc("a100", "  driverType: cuda\n")
    path.write_text(f"{HEADER}spec: {{}}\n---\n{bad}", encoding="utf-8")
    code, out, err = run(capsys, "render", "-f", str(path))
    assert (code, out) == (2, "")
    assert "document 2: spec.driverType: Input should be" in err


@needs_templates
def test_render_with_drivers_renders_the_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    alone = policy_file(tmp_path, "spec: {}\n")
    both = tmp_path / "both.yaml"
    both.write_text(alone.read_text(encoding="utf-8") + "---\n" + driver_doc(), encoding="utf-8")
    code, expected, _ = run(capsys, "render", "-f", str(alone))
    assert code == 0
    code, out, err = run(capsys, "render", "-f", str(both))
    assert (code, out) == (0, expected)
    assert err == (
        f"{both}: warning: nvidiadriver/a100 is valid but not rendered: the ClusterPolicy does not delegate "
        "its driver (driver.useNvidiaDriverCRD is false, or the driver is disabled)\n"
    )


@needs_templates
def test_render_with_drivers_renders_their_pools(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A policy that delegates its driver: the NVIDIADrivers' DaemonSets on the nodes each owns (their
    names hash metadata.uid, as the operator's), not the ClusterPolicy's; a GPU node no NVIDIADriver
    selects is named."""
    nodes = tmp_path / "nodes.yaml"
    labelled = node_body("gpu-a", {**NODE_OS, "pool": "a"}, typed=True)
    nodes.write_text(
        yaml.safe_dump_all([labelled, node_body("gpu-b", NODE_OS, typed=True)]), encoding="utf-8"
    )
    pool = driver_doc("a100", "  nodeSelector:\n    pool: a\n").replace(
        "name: a100", "name: a100\n  uid: u-1"
    )
    both = tmp_path / "both.yaml"
    both.write_text(f"{HEADER}spec:\n  driver:\n    useNvidiaDriverCRD: true\n---\n{pool}", encoding="utf-8")
    code, out, err = run(capsys, "render", "-f", str(both), "--nodes", str(nodes))
    assert code == 0, err
    names = list(daemonsets(documents(out)))
    assert "nvidia-driver-daemonset" not in names
    (pool_ds,) = [
        d for d in documents(out) if d["kind"] == "DaemonSet" and "gpu-driver" in d["metadata"]["name"]
    ]
    assert pool_ds["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "a"
    assert pool_ds["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert err == f"{both}: warning: no NVIDIADriver selects GPU nodes gpu-b: they get no driver\n"

    alone = policy_file(tmp_path, "spec:\n  driver:\n    useNvidiaDriverCRD: true\n")
    code, out, err = run(capsys, "render", "-f", str(alone))
    assert code == 0 and "nvidia-driver-daemonset" not in list(daemonsets(documents(out)))
    assert "none is in this file" in err
