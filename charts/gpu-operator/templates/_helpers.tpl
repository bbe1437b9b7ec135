{{/* Name of the chart, overridable with nameOverride. */}}
{{- define "gpu-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name when it already contains the chart name (a release called
gpu-operator gives objects called gpu-operator, as NVIDIA's chart does), else <release>-<chart>.
*/}}
{{- define "gpu-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "gpu-operator.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of the operator's pod and the Deployment's selector (never change on upgrade). */}}
{{- define "gpu-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object of the chart. */}}
{{- define "gpu-operator.labels" -}}
helm.sh/chart: {{ include "gpu-operator.chart" . }}
{{ include "gpu-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gpu-operator
{{- end }}

{{- define "gpu-operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "gpu-operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-operator.image" -}}
{{- $image := .Values.operator.image }}
{{- $tag := default .Chart.AppVersion $image.tag }}
{{- if $image.repository }}
{{- printf "%s/%s:%s" (trimSuffix "/" $image.repository) $image.name $tag }}
{{- else }}
{{- printf "%s:%s" $image.name $tag }}
{{- end }}
{{- end }}

{{/*
ClusterPolicySpec fields that are top-level values, copied unchanged into the ClusterPolicy's spec
(tests/unit/test_chart.py keeps this list equal to the model's fields, less `operator`).
*/}}
{{- define "gpu-operator.specKeys" -}}
daemonsets driver toolkit devicePlugin dcgmExporter dcgm nodeStatusExporter gfd mig migManager validator psa psp cdi hostPaths sandboxWorkloads vfioManager vgpuManager vgpuDeviceManager sandboxDevicePlugin kataManager kataSandboxDevicePlugin ccManager gds gdrcopy
{{- end }}

{{/* The ClusterPolicy's spec: the non-empty sections among the values above. */}}
{{- define "gpu-operator.clusterPolicySpec" -}}
{{- $spec := dict }}
{{- with .Values.clusterPolicy.operator }}
{{- $_ := set $spec "operator" . }}
{{- end }}
{{- range $key := splitList " " (include "gpu-operator.specKeys" .) }}
{{- with index $.Values $key }}
{{- $_ := set $spec $key . }}
{{- end }}
{{- end }}
{{- toYaml $spec }}
{{- end }}

{{/*
Names of the ClusterRoles and Roles the operator creates for its operands. The operator may bind
and create exactly these without holding their permissions itself (`bind`/`escalate` restricted by
resourceNames). tests/unit/test_chart.py keeps them equal to what `gpu-operator render` produces.
*/}}
{{- define "gpu-operator.operandClusterRoles" -}}
- nvidia-dcgm-exporter-read-pods
- nvidia-device-plugin
- nvidia-device-plugin-mps-control-daemon
- nvidia-driver
- nvidia-gpu-feature-discovery
- nvidia-mig-manager
- nvidia-node-status-exporter
- nvidia-operator-validator
{{- end }}

{{- define "gpu-operator.operandRoles" -}}
- nvidia-container-toolkit
- nvidia-dcgm
- nvidia-dcgm-exporter
- nvidia-device-plugin
- nvidia-device-plugin-mps-control-daemon
- nvidia-driver
- nvidia-gpu-feature-discovery
- nvidia-mig-manager
- nvidia-node-status-exporter
- nvidia-operator-validator
{{- end }}
