{{/* Names, labels and the list of builds every per-build template ranges over. */}}

{{- define "dsbw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dsbw.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dsbw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dsbw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dsbw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dsbw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: worker
app.kubernetes.io/part-of: durable-sandbox
app.kubernetes.io/managed-by: {{ .Release.Service }}
durable-sandbox.dev/worker-queue: {{ .Values.queue | quote }}
{{- end }}

{{- define "dsbw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dsbw.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The builds to run, the current one first: [{build, tag, replicas}] as JSON. */}}
{{- define "dsbw.builds" -}}
{{- $builds := list (dict "build" .Values.build "tag" (default .Values.build .Values.image.tag) "replicas" .Values.replicas) }}
{{- range .Values.keepBuilds }}
{{- if eq .build $.Values.build }}
{{- fail (printf "keepBuilds names build %s, which is the current build: keep older builds only" .build) }}
{{- end }}
{{- $builds = append $builds (dict "build" .build "tag" (default .build .tag) "replicas" (ternary .replicas 1 (hasKey . "replicas"))) }}
{{- end }}
{{- toJson $builds }}
{{- end }}

{{/* A build's Deployment (and PDB) name: the release's, then the build made a DNS label. */}}
{{- define "dsbw.buildName" -}}
{{- printf "%s-%s" (include "dsbw.fullname" .root) (.build | lower | replace "_" "-" | replace "." "-") | trunc 63 | trimSuffix "-" }}
{{- end }}
