{{- define "tally.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tally.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tally.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tally.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The environment of every Tally container: the database and the metrics
listener, secrets by reference only. The metrics listener binds every pod
interface, so the server requires the metrics token there. */}}
{{- define "tally.env" -}}
- name: DATABASE_URL
  valueFrom: {secretKeyRef: {name: {{ required "secrets.databaseURL.name is required" .Values.secrets.databaseURL.name }}, key: {{ .Values.secrets.databaseURL.key }}}}
{{- with .Values.secrets.poolerURL }}
{{- if .name }}
- name: TALLY_POOLER_URL
  valueFrom: {secretKeyRef: {name: {{ .name }}, key: {{ required "secrets.poolerURL.key is required with its name" .key }}}}
{{- end }}
{{- end }}
- name: TALLY_METRICS_TOKEN
  valueFrom: {secretKeyRef: {name: {{ required "secrets.metricsToken.name is required: /metrics answers only with it off loopback" .Values.secrets.metricsToken.name }}, key: {{ .Values.secrets.metricsToken.key }}}}
- name: TALLY_METRICS_ADDR
  value: {{ printf ":%d" (int .Values.metrics.port) | quote }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* The Stripe webhook secret: the API verifies Stripe's webhooks; workers
never see them. */}}
{{- define "tally.env.api" -}}
- name: STRIPE_WEBHOOK_SECRET
  valueFrom: {secretKeyRef: {name: {{ required "secrets.stripeWebhookSecret.name is required" .Values.secrets.stripeWebhookSecret.name }}, key: {{ .Values.secrets.stripeWebhookSecret.key }}}}
{{- end -}}

{{/* The Stripe API key: only workers call Stripe (charges, refunds,
reconciliation); the API's actions on charges schedule their jobs. */}}
{{- define "tally.env.worker" -}}
- name: STRIPE_API_KEY
  valueFrom: {secretKeyRef: {name: {{ required "secrets.stripeAPIKey.name is required" .Values.secrets.stripeAPIKey.name }}, key: {{ .Values.secrets.stripeAPIKey.key }}}}
{{- end -}}
