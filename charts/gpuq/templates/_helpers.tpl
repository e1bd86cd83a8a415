{{/* Name of the Deployment, ServiceAccount and cluster RBAC (manifests/: gpuq-operator). */}}
{{- define "gpuq.fullname" -}}
{{- default "gpuq-operator" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The pod labels the Services select (as manifests/deployment.yaml). */}}
{{- define "gpuq.selectorLabels" -}}
app.kubernetes.io/name: gpuq
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "gpuq.labels" -}}
app.kubernetes.io/name: gpuq
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpuq.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* The metadata block of a CRD from files/crds/: its name, the chart's labels, and (crds.keep) the
annotation that keeps `helm uninstall` from deleting it with every TrainingJob. */}}
{{- define "gpuq.crdMetadata" -}}
metadata:
  name: {{ .name }}
  labels:
    {{- include "gpuq.labels" .root | nindent 4 }}
  {{- if .root.Values.crds.keep }}
  annotations:
    helm.sh/resource-policy: keep
  {{- end }}
{{ end -}}
