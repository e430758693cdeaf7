{{/* Names: the release's, so two releases in one namespace never meet; "pvwire" for a release
called pvwire, as in k8s/. */}}
{{- define "pvwire.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pvwire.gatewayName" -}}
{{- printf "%s-pvagw" (include "pvwire.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pvwire.tokenSecret" -}}
{{- .Values.tokenKey.secretName | default (printf "%s-token-key" (include "pvwire.fullname" .)) -}}
{{- end -}}

{{- define "pvwire.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Selector labels: fixed for the life of a release (a Deployment's selector cannot change). */}}
{{- define "pvwire.selectorLabels" -}}
app.kubernetes.io/name: pvwire
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pvwire.labels" -}}
{{ include "pvwire.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pvwire.gatewaySelectorLabels" -}}
app.kubernetes.io/name: pvagw
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pvwire.gatewayLabels" -}}
{{ include "pvwire.gatewaySelectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The listener's scheme and port name: https when the server terminates TLS itself. */}}
{{- define "pvwire.portName" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{/* The drain, in seconds: the kubelet runs preStop (the load balancers' time to stop routing
here), then sends SIGTERM; the server answers /readyz 503, keeps serving for delaySeconds, closes
its WebSockets paced over windowSeconds, and exits. The grace period covers all of it and 10 s
more, so that the kubelet's SIGKILL never cuts the window short. */}}
{{- define "pvwire.terminationGracePeriodSeconds" -}}
{{- $d := .Values.drain -}}
{{- add (int $d.preStopSeconds) (int $d.delaySeconds) (int $d.windowSeconds) 10 -}}
{{- end -}}

{{/* A setting as an environment variable: lists comma-separated, whole numbers without the
exponent that YAML's floats would otherwise be written with (4194304, not 4.194304e+06). */}}
{{- define "pvwire.settingValue" -}}
{{- if kindIs "slice" . -}}
{{- join "," . -}}
{{- else if and (kindIs "float64" .) (eq (floor .) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}
