{{/* The release's resource name. */}}
{{- define "outbox-cdc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the release's pods. */}}
{{- define "outbox-cdc.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every resource. */}}
{{- define "outbox-cdc.labels" -}}
{{ include "outbox-cdc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The service account's name. */}}
{{- define "outbox-cdc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "outbox-cdc.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The metrics port, from config.metrics.addr. */}}
{{- define "outbox-cdc.metricsPort" -}}
{{- $addr := .Values.config.metrics.addr | default "" -}}
{{- if not (contains ":" $addr) -}}
{{- fail "config.metrics.addr must be host:port on the pod's address (e.g. 0.0.0.0:9187): the probes and Prometheus need it" -}}
{{- end -}}
{{- if hasPrefix "127." $addr -}}
{{- fail "config.metrics.addr listens on loopback: the kubelet's probes cannot reach it; use 0.0.0.0:9187" -}}
{{- end -}}
{{- last (splitList ":" $addr) -}}
{{- end -}}

{{/* The image: pinned by digest when image.digest is set, else by tag (the chart's appVersion by default). */}}
{{- define "outbox-cdc.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
The configuration file: config, and with sources their list (each source's config under its name,
its password as a file mounted from its Secret); the top-level postgres.url is then left out.
*/}}
{{- define "outbox-cdc.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- if .Values.sources -}}
{{- if $cfg.postgres -}}{{- $_ := unset $cfg.postgres "url" -}}{{- end -}}
{{- $list := list -}}
{{- range .Values.sources -}}
{{- $s := deepCopy (.config | default dict) -}}
{{- $_ := set $s "name" .name -}}
{{- if .passwordSecret -}}
{{- $pg := deepCopy ($s.postgres | default dict) -}}
{{- $_ := set $pg "password_file" (printf "/etc/outbox-cdc-passwords/%s/%s" .name .passwordSecret.key) -}}
{{- $_ := set $s "postgres" $pg -}}
{{- end -}}
{{- $list = append $list $s -}}
{{- end -}}
{{- $_ := set $cfg "sources" $list -}}
{{- /* The fleet's group is the release: stable whatever the list holds, one per release. */ -}}
{{- $fleet := deepCopy ($cfg.fleet | default dict) -}}
{{- if not $fleet.group -}}{{- $_ := set $fleet "group" (include "outbox-cdc.fullname" .) -}}{{- end -}}
{{- $_ := set $cfg "fleet" $fleet -}}
{{- end -}}
{{- if .Values.secrets.adminToken.name -}}
{{- $m := deepCopy ($cfg.metrics | default dict) -}}
{{- $_ := set $m "admin_token_file" (printf "/etc/outbox-cdc-admin/%s" .Values.secrets.adminToken.key) -}}
{{- $_ := set $cfg "metrics" $m -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}
