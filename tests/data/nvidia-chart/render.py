"""Render NVIDIA's gpu-operator chart for every case of cases.yaml and keep what the comparison needs.

Run at test-writing time, not by the tests (NVIDIA's chart is not part of this repository):

    python tests/data/nvidia-chart/render.py --repo <git dir of github.com/NVIDIA/gpu-operator> \\
        --ref v26.7.0 --helm "$(make -s helm-path)"

It extracts deployments/gpu-operator at --ref into a temporary folder, sets Chart.yaml's version and
appVersion to the tag (what NVIDIA's release does; the source tree says v1.0.0-devel/main-latest),
renders each case with `helm template` and writes <case>.yaml: the ClusterPolicy (or the GPUCluster)
and the ConfigMaps the chart created (not those of its NFD subchart; defaults.nfd.yaml has those of
the default case). It also writes values-<ref>.yaml: NVIDIA's values.yaml at --ref without its
comments (the input of the nvidia-values-file case).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CHART = "deployments/gpu-operator"
RELEASE = "gpu-operator"
NAMESPACE = "gpu-operator"
KUBE_VERSION = "1.36.0"
KEPT = ("ClusterPolicy", "GPUCluster", "ConfigMap")


def extract(repo: str, ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "--git-dir", repo, "archive", ref, CHART], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    chart = into / CHART
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = meta["appVersion"] = ref
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return chart


def render(helm: str, chart: Path, args: list[str], *, nfd: bool = False) -> list[dict[str, Any]]:
    """The gpu-operator chart's ClusterPolicy, GPUCluster and ConfigMaps, or (nfd) every object of its NFD
    subchart."""
    args = [str(HERE / a) if a.endswith(".yaml") else a for a in args]
    proc = subprocess.run(
        [
            helm,
            "template",
            RELEASE,
            str(chart),
            "--namespace",
            NAMESPACE,
            "--kube-version",
            KUBE_VERSION,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"helm template {' '.join(args)} failed:\n{proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    if nfd:
        return [
            d
            for d in docs
            if d["metadata"].get("labels", {}).get("helm.sh/chart", "").startswith("node-feature-")
        ]
    return [
        d
        for d in docs
        if d["kind"] in KEPT and d["metadata"]["labels"]["helm.sh/chart"].startswith("gpu-operator-")
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", required=True, help="git directory of NVIDIA/gpu-operator")
    parser.add_argument("--ref", required=True, help="tag to render, e.g. v26.7.0")
    parser.add_argument("--helm", required=True, help="helm binary")
    options = parser.parse_args()
    cases = yaml.safe_load((HERE / "cases.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        chart = extract(options.repo, options.ref, Path(tmp))
        values = yaml.safe_load((chart / "values.yaml").read_text())
        (HERE / f"values-{options.ref}.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
        for name, case in cases.items():
            objects = render(options.helm, chart, case["args"])
            header = f"# NVIDIA's chart {options.ref}: helm template {' '.join(case['args'])}\n"
            (HERE / f"{name}.yaml").write_text(header + yaml.safe_dump_all(objects, sort_keys=True))
            print(f"{name}: {len(objects)} objects")
        # NVIDIA's chart installs NFD by default: what its NFD subchart renders, with NVIDIA's values.
        objects = render(options.helm, chart, [], nfd=True)
        header = "# NVIDIA's chart " + options.ref + ": helm template (its NFD subchart's objects)\n"
        (HERE / "defaults.nfd.yaml").write_text(header + yaml.safe_dump_all(objects, sort_keys=True))
        print(f"defaults.nfd: {len(objects)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
