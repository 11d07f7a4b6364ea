{{/* The name of every object of this release. */}}
{{- define "switchboard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "switchboard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: relay
{{- end -}}

{{- define "switchboard.labels" -}}
{{ include "switchboard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "switchboard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The headless Service that gives each relay a stable DNS name. */}}
{{- define "switchboard.peersService" -}}
{{ include "switchboard.fullname" . }}-peers
{{- end -}}

{{- define "switchboard.adminSecret" -}}
{{ .Values.admin.existingSecret | default (printf "%s-admin" (include "switchboard.fullname" .)) }}
{{- end -}}

{{- define "switchboard.fleetSecret" -}}
{{ .Values.fleetSecret.existingSecret | default (printf "%s-fleet-secret" (include "switchboard.fullname" .)) }}
{{- end -}}

{{/*
The pod's termination grace: the preStop's drain (drainTimeout) and the
shutdown delay, with a margin, so that the kubelet's SIGKILL never cuts a
drain short.
*/}}
{{- define "switchboard.terminationGrace" -}}
{{- $drain := .Values.drainTimeout | toString | trimSuffix "s" | int -}}
{{- $delay := .Values.shutdownDelay | toString | trimSuffix "s" | int -}}
{{- add $drain $delay 15 -}}
{{- end -}}
