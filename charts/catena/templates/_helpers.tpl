{{/*
catena.name is the chart's name, or nameOverride.
*/}}
{{- define "catena.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
catena.fullname names the release's objects: fullnameOverride, else the
release name when it already says "catena", else "<release>-catena". Object
names are DNS labels, so it is cut at 63 characters.
*/}}
{{- define "catena.fullname" -}}
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

{{/*
catena.chart is the chart label's value, "catena-0.1.0".
*/}}
{{- define "catena.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
catena.labels go on every object of the release.
*/}}
{{- define "catena.labels" -}}
helm.sh/chart: {{ include "catena.chart" . }}
{{ include "catena.selectorLabels" . }}
app.kubernetes.io/version: {{ include "catena.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/part-of: catena
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
catena.selectorLabels select the operator's pods. They never change between
upgrades, because a Deployment's selector is immutable.
*/}}
{{- define "catena.selectorLabels" -}}
app.kubernetes.io/name: {{ include "catena.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
catena.serviceAccountName is the operator's ServiceAccount.
*/}}
{{- define "catena.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "catena.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
catena.imageTag is image.tag, or the chart's appVersion.
*/}}
{{- define "catena.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
catena.image is the one image of the release: the operator's, and the one it
gives replica and ingestion pods through --image.
*/}}
{{- define "catena.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "catena.imageTag" .) }}
{{- end }}

{{/*
catena.managerRules are the operator's cluster-wide RBAC rules. They are not
written here: `make manifests` generates config/rbac/role.yaml from the
+kubebuilder:rbac markers in controllers/ and copies it to
files/manager-role.yaml, and `make verify` fails when the copy is stale.
*/}}
{{- define "catena.managerRules" -}}
{{- $role := .Files.Get "files/manager-role.yaml" | fromYaml }}
{{- if not $role.rules }}
{{- fail "files/manager-role.yaml has no rules: run make manifests" }}
{{- end }}
{{- toYaml $role.rules }}
{{- end }}
