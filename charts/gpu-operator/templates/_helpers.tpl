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
{{- with .Values.operator.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpu-operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "gpu-operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's own image: operator.image's fields over their defaults. NVIDIA's values name NVIDIA's
operator image (operator.repository, operator.image as a string, operator.version): this chart does not
run that one, so they leave this chart's image in place (the install notes say so).
*/}}
{{- define "gpu-operator.imageFields" -}}
{{- $given := .Values.operator.image }}
{{- $fields := dict "repository" "ghcr.io/gpu-operator" "name" "gpu-operator" "tag" "" "pullPolicy" "IfNotPresent" }}
{{- if kindIs "map" $given }}
{{- range $key, $value := $given }}
{{- $_ := set $fields $key $value }}
{{- end }}
{{- end }}
{{- toYaml $fields }}
{{- end }}

{{- define "gpu-operator.image" -}}
{{- $image := include "gpu-operator.imageFields" . | fromYaml }}
{{- $tag := $image.tag | default .Chart.AppVersion }}
{{- if $image.repository }}
{{- printf "%s/%s:%s" (trimSuffix "/" $image.repository) $image.name $tag }}
{{- else }}
{{- printf "%s:%s" $image.name $tag }}
{{- end }}
{{- end }}

{{/* The operator image's pull policy: NVIDIA's operator.imagePullPolicy, else operator.image.pullPolicy. */}}
{{- define "gpu-operator.pullPolicy" -}}
{{- .Values.operator.imagePullPolicy | default (include "gpu-operator.imageFields" . | fromYaml).pullPolicy }}
{{- end }}

{{/* operator.imagePullSecrets as a pod's list: names (NVIDIA's form) or {name: ...} objects. */}}
{{- define "gpu-operator.imagePullSecrets" -}}
{{- $out := list }}
{{- range .Values.operator.imagePullSecrets }}
{{- $out = append $out (ternary (dict "name" .) . (kindIs "string" .)) }}
{{- end }}
{{- with $out }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Copy into .to the keys of .from named in .keys that are set: NVIDIA's chart leaves out a key whose value
is empty, false or zero, so the operator's default applies. `version` is written as a string (a
`--set gds.version=2.17` gives a number), as NVIDIA's chart quotes it.
*/}}
{{- define "gpu-operator.copySet" -}}
{{- $from := .from | default dict }}
{{- range $key := .keys }}
{{- with index $from $key }}
{{- $_ := set $.to $key (ternary (toString .) . (eq $key "version")) }}
{{- end }}
{{- end }}
{{- end }}

{{/* An operand section as NVIDIA's chart writes it: `enabled` when given, the image and container
fields when set, then .keys when set. Prints YAML (use fromYaml). */}}
{{- define "gpu-operator.component" -}}
{{- $from := .from | default dict }}
{{- $out := dict }}
{{- if hasKey $from "enabled" }}
{{- $_ := set $out "enabled" (index $from "enabled" | default false) }}
{{- end }}
{{- $keys := concat (list "repository" "image" "version" "imagePullPolicy" "imagePullSecrets" "resources" "env" "args" "hostNetwork") (.keys | default list) }}
{{- include "gpu-operator.copySet" (dict "from" $from "to" $out "keys" $keys) }}
{{- toYaml $out }}
{{- end }}

{{/* The image of NVIDIA's driver manager (a `manager`/`driverManager` section): the fields that are set. */}}
{{- define "gpu-operator.driverManager" -}}
{{- $out := dict }}
{{- include "gpu-operator.copySet" (dict "from" . "to" $out "keys" (list "repository" "image" "version" "imagePullPolicy" "env")) }}
{{- toYaml $out }}
{{- end }}

{{/* The driver's upgradePolicy as NVIDIA's chart writes it, in the ClusterPolicy and in the default
NVIDIADriver: the chart's `gpuPodDeletion` becomes `podDeletion`. Prints YAML (use fromYaml). */}}
{{- define "gpu-operator.upgradePolicy" -}}
{{- $u := . }}
{{- $policy := dict "autoUpgrade" ($u.autoUpgrade | default false) "maxParallelUpgrades" ($u.maxParallelUpgrades | default 0) "maxUnavailable" ($u.maxUnavailable | default "25%") }}
{{- $wait := dict "timeoutSeconds" (dig "waitForCompletion" "timeoutSeconds" nil $u) }}
{{- include "gpu-operator.copySet" (dict "from" $u.waitForCompletion "to" $wait "keys" (list "podSelector")) }}
{{- $_ := set $policy "waitForCompletion" $wait }}
{{- $deletion := mergeOverwrite (deepCopy ($u.gpuPodDeletion | default dict)) ($u.podDeletion | default dict) }}
{{- $_ := set $policy "podDeletion" (dict "force" ($deletion.force | default false) "timeoutSeconds" $deletion.timeoutSeconds "deleteEmptyDir" ($deletion.deleteEmptyDir | default false)) }}
{{- $drainValues := $u.drain | default dict }}
{{- $drain := dict "enable" ($drainValues.enable | default false) "force" ($drainValues.force | default false) "timeoutSeconds" $drainValues.timeoutSeconds "deleteEmptyDir" ($drainValues.deleteEmptyDir | default false) }}
{{- include "gpu-operator.copySet" (dict "from" $drainValues "to" $drain "keys" (list "podSelector")) }}
{{- $_ := set $policy "drain" $drain }}
{{- include "gpu-operator.copySet" (dict "from" $u "to" $policy "keys" (list "canary" "validation")) }}
{{- toYaml $policy }}
{{- end }}

{{/* The spec of the default NVIDIADriver the chart creates (driver.nvidiaDriverCRD.enabled and
deployDefaultCR), from the same values NVIDIA's chart reads: the driver section, the daemonsets' labels,
annotations and tolerations, and the gds and gdrcopy sections. Prints YAML (use fromYaml). */}}
{{- define "gpu-operator.defaultDriverSpec" -}}
{{- $v := .Values }}
{{- $d := $v.driver | default dict }}
{{- $spec := include "gpu-operator.component" (dict "from" (omit $d "enabled") "keys" (list "kernelModuleType" "usePrecompiled" "startupProbe" "livenessProbe" "readinessProbe" "secretEnv")) | fromYaml }}
{{- $_ := set $spec "default" true }}
{{- $_ := set $spec "driverType" (dig "nvidiaDriverCRD" "driverType" "" $d | default "gpu") }}
{{- $_ := set $spec "usePrecompiled" (dig "usePrecompiled" false $d) }}
{{- $ds := $v.daemonsets | default dict }}
{{- include "gpu-operator.copySet" (dict "from" $ds "to" $spec "keys" (list "labels" "annotations" "tolerations")) }}
{{- with $d.manager }}
{{- $_ := set $spec "manager" (include "gpu-operator.driverManager" . | fromYaml) }}
{{- end }}
{{- with $d.upgradePolicy }}
{{- $_ := set $spec "upgradePolicy" (include "gpu-operator.upgradePolicy" . | fromYaml) }}
{{- end }}
{{- $_ := set $spec "rdma" (dict "enabled" (dig "rdma" "enabled" false $d) "useHostMofed" (dig "rdma" "useHostMofed" false $d)) }}
{{- with dig "repoConfig" "configMapName" "" $d }}
{{- $_ := set $spec "repoConfig" (dict "name" .) }}
{{- end }}
{{- with dig "certConfig" "name" "" $d }}
{{- $_ := set $spec "certConfig" (dict "name" .) }}
{{- end }}
{{- $licensing := $d.licensingConfig | default dict }}
{{- $nls := ternary true $licensing.nlsEnabled (kindIs "invalid" $licensing.nlsEnabled) }}
{{- if $licensing.secretName }}
{{- $_ := set $spec "licensingConfig" (dict "secretName" $licensing.secretName "nlsEnabled" $nls) }}
{{- else if $licensing.configMapName }}
{{- $_ := set $spec "licensingConfig" (dict "name" $licensing.configMapName "nlsEnabled" $nls) }}
{{- end }}
{{- with dig "virtualTopology" "config" "" $d }}
{{- $_ := set $spec "virtualTopologyConfig" (dict "name" .) }}
{{- end }}
{{- with dig "kernelModuleConfig" "name" "" $d }}
{{- $_ := set $spec "kernelModuleConfig" (dict "name" .) }}
{{- end }}
{{- if dig "enabled" false ($v.gds | default dict) }}
{{- $_ := set $spec "gds" (include "gpu-operator.component" (dict "from" $v.gds) | fromYaml) }}
{{- end }}
{{- with $v.gdrcopy }}
{{- $gdrcopy := include "gpu-operator.component" (dict "from" .) | fromYaml }}
{{- $_ := set $gdrcopy "enabled" (dig "enabled" false .) }}
{{- $_ := set $spec "gdrcopy" $gdrcopy }}
{{- end }}
{{- toYaml $spec }}
{{- end }}

{{/* Whether this release creates the ClusterPolicy: clusterPolicy.create and NVIDIA's clusterPolicy.deployCR. */}}
{{- define "gpu-operator.createsPolicy" -}}
{{- if and .Values.clusterPolicy.create (dig "deployCR" true .Values.clusterPolicy) }}true{{ end }}
{{- end }}

{{/* The ClusterPolicy's spec.operator: NVIDIA's keys of the chart's `operator` section, then
clusterPolicy.operator (which wins where both are set). */}}
{{- define "gpu-operator.policyOperator" -}}
{{- $out := dict }}
{{- include "gpu-operator.copySet" (dict "from" .Values.operator "to" $out "keys" (list "runtimeClass" "defaultRuntime" "use_ocp_driver_toolkit")) }}
{{- toYaml (mergeOverwrite $out (deepCopy (.Values.clusterPolicy.operator | default dict))) }}
{{- end }}

{{/*
The ClusterPolicy's spec, written section by section as NVIDIA's chart writes it from the same values
(deployments/gpu-operator/templates/clusterpolicy.yaml): the same sections and the same JSON paths,
so `kubectl patch --type=json` works as it does there. tests/unit/test_nvidia_values.py compares the
result with NVIDIA's rendering for its defaults and documented overrides.
*/}}
{{- define "gpu-operator.clusterPolicySpec" -}}
{{- /* Every section as a map, also when the values lack it (`helm upgrade --reuse-values` from a release
of an older chart): a missing field then falls back to the operator's default. */}}
{{- $v := dict }}
{{- range $name := list "hostPaths" "daemonsets" "validator" "mig" "psa" "psp" "cdi" "driver" "vgpuManager" "kataManager" "vfioManager" "vgpuDeviceManager" "ccManager" "toolkit" "devicePlugin" "dcgm" "dcgmExporter" "gfd" "migManager" "nodeStatusExporter" "gds" "gdrcopy" "sandboxWorkloads" "sandboxDevicePlugin" "kataSandboxDevicePlugin" }}
{{- $_ := set $v $name (index $.Values $name | default dict) }}
{{- end }}
{{- $spec := dict }}

{{- $paths := dict }}
{{- include "gpu-operator.copySet" (dict "from" $v.hostPaths "to" $paths "keys" (list "rootFS" "driverInstallDir" "kubeletRootDir")) }}
{{- $_ := set $spec "hostPaths" $paths }}

{{- $_ := set $spec "operator" (include "gpu-operator.policyOperator" . | fromYaml) }}

{{- $ds := $v.daemonsets | default dict }}
{{- $labels := dict "helm.sh/chart" (include "gpu-operator.chart" .) "app.kubernetes.io/managed-by" (include "gpu-operator.name" .) }}
{{- $daemonsets := dict "labels" (mergeOverwrite $labels (deepCopy ($ds.labels | default dict))) }}
{{- include "gpu-operator.copySet" (dict "from" $ds "to" $daemonsets "keys" (list "annotations" "tolerations" "priorityClassName" "updateStrategy" "podSecurityContext")) }}
{{- with $ds.rollingUpdate }}
{{- $_ := set $daemonsets "rollingUpdate" (dict "maxUnavailable" (toString .maxUnavailable)) }}
{{- end }}
{{- $_ := set $spec "daemonsets" $daemonsets }}

{{- $validator := include "gpu-operator.component" (dict "from" $v.validator) | fromYaml }}
{{- range $step := list "plugin" "cuda" "driver" "toolkit" "vfioPCI" "vgpuManager" "vgpuDevices" }}
{{- with index ($v.validator | default dict) $step }}
{{- $_ := set $validator $step (dict "env" (.env | default list)) }}
{{- end }}
{{- end }}
{{- $_ := set $spec "validator" $validator }}

{{- $mig := dict }}
{{- include "gpu-operator.copySet" (dict "from" $v.mig "to" $mig "keys" (list "strategy")) }}
{{- $_ := set $spec "mig" $mig }}

{{- $_ := set $spec "psa" (dict "enabled" (dig "enabled" false $v.psa)) }}
{{- with $v.psp }}
{{- $_ := set $spec "psp" . }}
{{- end }}

{{- $cdi := dict "enabled" (dig "enabled" true $v.cdi) }}
{{- if and $cdi.enabled (dig "nriPluginEnabled" false $v.cdi) }}
{{- $_ := set $cdi "nriPluginEnabled" true }}
{{- end }}
{{- $_ := set $spec "cdi" $cdi }}

{{- $d := $v.driver }}
{{- $crd := or (dig "nvidiaDriverCRD" "enabled" false $d) (dig "useNvidiaDriverCRD" false $d) }}
{{- $driver := dict "enabled" (dig "enabled" true $d) "useNvidiaDriverCRD" $crd }}
{{- if not $crd }}
{{- $_ := set $driver "kernelModuleType" (dig "kernelModuleType" "auto" $d) }}
{{- $_ := set $driver "usePrecompiled" (dig "usePrecompiled" false $d) }}
{{- $_ := mergeOverwrite $driver (include "gpu-operator.component" (dict "from" (omit $d "enabled") "keys" (list "startupProbe" "livenessProbe" "readinessProbe" "repoConfig" "certConfig" "licensingConfig" "virtualTopology" "kernelModuleConfig" "secretEnv" "useOpenKernelModules")) | fromYaml) }}
{{- $_ := set $driver "rdma" (dict "enabled" (dig "rdma" "enabled" false $d) "useHostMofed" (dig "rdma" "useHostMofed" false $d)) }}
{{- $_ := set $driver "manager" (include "gpu-operator.driverManager" ($d.manager | default dict) | fromYaml) }}
{{- end }}
{{- with $d.upgradePolicy }}
{{- $_ := set $driver "upgradePolicy" (include "gpu-operator.upgradePolicy" . | fromYaml) }}
{{- end }}
{{- if $d.hostNetwork }}
{{- $_ := set $driver "hostNetwork" true }}
{{- end }}
{{- $_ := set $spec "driver" $driver }}

{{- $vgpu := include "gpu-operator.component" (dict "from" $v.vgpuManager "keys" (list "kernelModuleConfig")) | fromYaml }}
{{- $_ := set $vgpu "driverManager" (include "gpu-operator.driverManager" (dig "driverManager" dict $v.vgpuManager) | fromYaml) }}
{{- $_ := set $spec "vgpuManager" $vgpu }}
{{- $_ := set $spec "kataManager" (include "gpu-operator.component" (dict "from" $v.kataManager "keys" (list "config")) | fromYaml) }}
{{- $vfio := include "gpu-operator.component" (dict "from" $v.vfioManager) | fromYaml }}
{{- $_ := set $vfio "driverManager" (include "gpu-operator.driverManager" (dig "driverManager" dict $v.vfioManager) | fromYaml) }}
{{- $_ := set $spec "vfioManager" $vfio }}
{{- $_ := set $spec "vgpuDeviceManager" (include "gpu-operator.component" (dict "from" $v.vgpuDeviceManager "keys" (list "config")) | fromYaml) }}
{{- $_ := set $spec "ccManager" (include "gpu-operator.component" (dict "from" $v.ccManager "keys" (list "defaultMode")) | fromYaml) }}
{{- $_ := set $spec "toolkit" (include "gpu-operator.component" (dict "from" $v.toolkit "keys" (list "installDir")) | fromYaml) }}

{{- $plugin := include "gpu-operator.component" (dict "from" $v.devicePlugin) | fromYaml }}
{{- with dig "config" "name" "" $v.devicePlugin }}
{{- $_ := set $plugin "config" (dict "name" . "default" (dig "config" "default" "" $v.devicePlugin | toString)) }}
{{- end }}
{{- /* NVIDIA's chart never writes mps; this chart does when it differs from the default. */}}
{{- with dig "mps" "root" "" $v.devicePlugin }}
{{- if ne . "/run/nvidia/mps" }}
{{- $_ := set $plugin "mps" (dict "root" .) }}
{{- end }}
{{- end }}
{{- $_ := set $spec "devicePlugin" $plugin }}

{{- $_ := set $spec "dcgm" (include "gpu-operator.component" (dict "from" $v.dcgm "keys" (list "hostPort")) | fromYaml) }}

{{- $exporter := include "gpu-operator.component" (dict "from" $v.dcgmExporter "keys" (list "annotations" "serviceMonitor" "service" "hostPID" "hpcJobMapping" "enablePodLabels" "enablePodUID" "podLabelAllowlistRegex" "serviceMonitoring")) | fromYaml }}
{{- with dig "config" "name" "" $v.dcgmExporter }}
{{- $_ := set $exporter "config" (dict "name" .) }}
{{- end }}
{{- $_ := set $spec "dcgmExporter" $exporter }}

{{- $_ := set $spec "gfd" (include "gpu-operator.component" (dict "from" $v.gfd) | fromYaml) }}

{{- $mm := include "gpu-operator.component" (dict "from" $v.migManager "keys" (list "gpuClientsConfig")) | fromYaml }}
{{- with dig "config" dict $v.migManager }}
{{- $config := dict "default" (.default | default "" | toString) }}
{{- include "gpu-operator.copySet" (dict "from" . "to" $config "keys" (list "name")) }}
{{- $_ := set $mm "config" $config }}
{{- end }}
{{- $_ := set $spec "migManager" $mm }}

{{- $_ := set $spec "nodeStatusExporter" (include "gpu-operator.component" (dict "from" $v.nodeStatusExporter) | fromYaml) }}
{{- range $name := list "gds" "gdrcopy" }}
{{- with index $v $name }}
{{- $_ := set $spec $name (include "gpu-operator.component" (dict "from" .) | fromYaml) }}
{{- end }}
{{- end }}

{{- $sandbox := dict "enabled" (dig "enabled" false $v.sandboxWorkloads) }}
{{- include "gpu-operator.copySet" (dict "from" $v.sandboxWorkloads "to" $sandbox "keys" (list "defaultWorkload" "mode")) }}
{{- $_ := set $spec "sandboxWorkloads" $sandbox }}
{{- /* NVIDIA's chart writes sandboxDevicePlugin.enabled only when true. */}}
{{- $sdp := include "gpu-operator.component" (dict "from" (omit ($v.sandboxDevicePlugin | default dict) "enabled")) | fromYaml }}
{{- if dig "enabled" false $v.sandboxDevicePlugin }}
{{- $_ := set $sdp "enabled" true }}
{{- end }}
{{- $_ := set $spec "sandboxDevicePlugin" $sdp }}
{{- $_ := set $spec "kataSandboxDevicePlugin" (include "gpu-operator.component" (dict "from" $v.kataSandboxDevicePlugin) | fromYaml) }}
{{- toYaml $spec }}
{{- end }}

{{/*
The GPUCluster's spec, written as NVIDIA's chart writes it from the same values (deployments/gpu-operator/
templates/gpucluster.yaml at v26.7.0): draDriver, dcgm, dcgmExporter, hostPaths and daemonsets, each
field only when set. tests/unit/test_nvidia_values.py compares it with NVIDIA's rendering. Added to
NVIDIA's: gpuCluster.nodeSelector as spec.nodeSelector, when not empty.
*/}}
{{- define "gpu-operator.gpuClusterSpec" -}}
{{- $v := dict }}
{{- range $name := list "draDriver" "dcgm" "dcgmExporter" "hostPaths" "daemonsets" "gpuCluster" }}
{{- $_ := set $v $name (index $.Values $name | default dict) }}
{{- end }}
{{- $spec := dict }}

{{- $dra := dict }}
{{- include "gpu-operator.copySet" (dict "from" $v.draDriver "to" $dra "keys" (list "repository" "image" "version" "imagePullPolicy" "imagePullSecrets" "featureGates")) }}
{{- with dig "gpus" "kubeletPlugin" dict $v.draDriver }}
{{- $_ := set $dra "gpus" (dict "kubeletPlugin" .) }}
{{- end }}
{{- $cd := dig "computeDomains" dict $v.draDriver }}
{{- $domains := dict "enabled" (dig "enabled" true $cd) }}
{{- include "gpu-operator.copySet" (dict "from" $cd "to" $domains "keys" (list "controller" "kubeletPlugin")) }}
{{- $_ := set $dra "computeDomains" $domains }}
{{- $_ := set $spec "draDriver" $dra }}

{{- $dcgm := dict "enabled" (dig "enabled" false $v.dcgm) }}
{{- include "gpu-operator.copySet" (dict "from" $v.dcgm "to" $dcgm "keys" (list "repository" "image" "version" "imagePullPolicy" "imagePullSecrets" "args" "env" "resources" "hostNetwork")) }}
{{- $_ := set $spec "dcgm" $dcgm }}

{{- $exporter := dict "enabled" (dig "enabled" true $v.dcgmExporter) }}
{{- include "gpu-operator.copySet" (dict "from" $v.dcgmExporter "to" $exporter "keys" (list "repository" "image" "version" "imagePullPolicy" "imagePullSecrets" "annotations" "args" "env" "resources" "hostPID" "hostNetwork" "hpcJobMapping" "enablePodLabels" "enablePodUID" "podLabelAllowlistRegex" "service" "serviceMonitor")) }}
{{- with dig "config" "name" "" $v.dcgmExporter }}
{{- $_ := set $exporter "config" (dict "name" .) }}
{{- end }}
{{- $_ := set $spec "dcgmExporter" $exporter }}

{{- $paths := dict "driverInstallDir" ($v.hostPaths.driverInstallDir | default "/run/nvidia/driver") }}
{{- include "gpu-operator.copySet" (dict "from" $v.hostPaths "to" $paths "keys" (list "kubeletRootDir")) }}
{{- $_ := set $spec "hostPaths" $paths }}

{{- $_ := set $spec "daemonsets" $v.daemonsets }}
{{- with $v.gpuCluster.nodeSelector }}
{{- $_ := set $spec "nodeSelector" . }}
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
{{- $own := (include "gpu-operator.policyOperator" . | fromYaml).runtimeClass | default $all.RuntimeClass.default }}
{{- toYaml (uniq (prepend $all.RuntimeClass.names $own)) }}
{{- end }}
