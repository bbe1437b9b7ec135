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
The RBAC objects and RuntimeClasses the operator creates for its operands: their names (the only
ones its RBAC lets it change or delete) and the CEL that pins their content (templates/
admission-policy.yaml). Generated from the operator's templates by hack/operand_rbac.py (make crd);
tests/unit/test_chart.py fails when it is stale.
*/}}
{{- define "gpu-operator.operandRBAC" -}}
{{- .Files.Get "files/operand-rbac.yaml" }}
{{- end }}

{{/* Names of one kind of operand object, as a YAML list. */}}
{{- define "gpu-operator.operandNames" -}}
{{- $all := include "gpu-operator.operandRBAC" .root | fromYaml }}
{{- toYaml (index $all .kind "names") }}
{{- end }}

{{/* The RuntimeClasses the operator creates: the ClusterPolicy's operator.runtimeClass and the CDI ones. */}}
{{- define "gpu-operator.runtimeClasses" -}}
{{- $all := include "gpu-operator.operandRBAC" . | fromYaml }}
{{- $own := .Values.clusterPolicy.operator.runtimeClass | default $all.RuntimeClass.default }}
{{- toYaml (uniq (prepend $all.RuntimeClass.names $own)) }}
{{- end }}
