{{/* Names, labels and the shared pieces of every Kumiki pod. */}}

{{- define "kumiki.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kumiki.fullname" -}}
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

{{- define "kumiki.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kumiki.labels" -}}
helm.sh/chart: {{ include "kumiki.chart" . }}
app.kubernetes.io/name: {{ include "kumiki.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kumiki
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kumiki.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kumiki.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kumiki.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kumiki.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kumiki.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The services the chart knows: values key -> service name (ports' env prefix, resource suffix), Python module,
whether it has a Postgres schema. Mirrors each services/kumiki/<svc>/app.py ServiceSpec.
*/}}
{{- define "kumiki.catalog" -}}
placement: {name: placement, module: kumiki.placement, database: false}
quota: {name: quota, module: kumiki.quota, database: true}
forecast: {name: forecast, module: kumiki.forecast, database: true}
preemption: {name: preemption, module: kumiki.preemption, database: true}
telemetryIngest: {name: telemetry-ingest, module: kumiki.telemetry, database: false}
{{- end }}

{{- define "kumiki.kafkaTLS" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end }}
{{- end }}

{{- define "kumiki.kafkaSASL" -}}
{{- if hasPrefix "SASL" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}

{{/* Checks across values that the JSON schema cannot express; each message names the values to change. */}}
{{- define "kumiki.validate" -}}
{{- if and (include "kumiki.kafkaSASL" .) (not .Values.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.sasl.existingSecret: required with kafka.securityProtocol=%s (a Secret holding the SASL password)" .Values.kafka.securityProtocol) }}
{{- end }}
{{- if and (include "kumiki.kafkaSASL" .) (not .Values.kafka.sasl.username) (not .Values.kafka.sasl.usernameKey) }}
{{- fail "kafka.sasl.username: required with SASL (or kafka.sasl.usernameKey naming a key of kafka.sasl.existingSecret)" }}
{{- end }}
{{- if and (include "kumiki.kafkaTLS" .) (not .Values.kafka.tls.existingSecret) }}
{{- fail (printf "kafka.tls.existingSecret: required with kafka.securityProtocol=%s (a Secret holding the broker CA)" .Values.kafka.securityProtocol) }}
{{- end }}
{{- if and .Values.kafka.tls.clientCertificate (not (include "kumiki.kafkaTLS" .)) }}
{{- fail "kafka.tls.clientCertificate: needs kafka.securityProtocol SSL or SASL_SSL" }}
{{- end }}
{{- if and .Values.grpcTLS.enabled (not .Values.grpcTLS.existingSecret) }}
{{- fail "grpcTLS.existingSecret: required with grpcTLS.enabled (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and .Values.grpcTLS.clientAuth (not .Values.grpcTLS.enabled) }}
{{- fail "grpcTLS.clientAuth: needs grpcTLS.enabled" }}
{{- end }}
{{- if and .Values.grpcTLS.enabled (eq .Values.probes.type "grpc") }}
{{- fail "probes.type: grpc cannot be used with grpcTLS.enabled (kubelet's gRPC probe has no TLS); use http" }}
{{- end }}
{{- $needsDatabase := or .Values.services.quota.enabled .Values.services.forecast.enabled .Values.services.preemption.enabled }}
{{- if and $needsDatabase (not .Values.database.existingSecret) }}
{{- fail "database.existingSecret: required (a Secret whose database.urlKey holds the Postgres URL) for quota, forecast and preemption" }}
{{- end }}
{{- $placement := .Values.services.placement }}
{{- if and $placement.enabled $placement.quotaAdmission.enabled (not .Values.services.quota.enabled) }}
{{- fail "services.placement.quotaAdmission.enabled: needs services.quota.enabled (or turn admission off: allow-all)" }}
{{- end }}
{{- $auth := .Values.services.quota.auth }}
{{- if and .Values.services.quota.enabled (not $auth.tokensSecret) (not .Values.grpcTLS.clientAuth) (not $auth.allowAnonymous) }}
{{- fail "services.quota.auth: the quota service refuses to start without caller authentication: set services.quota.auth.tokensSecret, grpcTLS.clientAuth=true, or services.quota.auth.allowAnonymous=true (development only)" }}
{{- end }}
{{- end }}

{{/* Kafka settings shared by the services and the agent. */}}
{{- define "kumiki.kafkaEnv" -}}
- name: KUMIKI_KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: KUMIKI_TOPIC_PREFIX
  value: {{ .Values.kafka.topicPrefix | quote }}
- name: KUMIKI_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
- name: KUMIKI_KAFKA_PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
- name: KUMIKI_KAFKA_REPLICATION
  value: {{ .Values.kafka.replicationFactor | quote }}
- name: KUMIKI_KAFKA_IDEMPOTENT
  value: {{ .Values.kafka.idempotent | quote }}
{{- if include "kumiki.kafkaSASL" . }}
- name: KUMIKI_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
{{- if .Values.kafka.sasl.usernameKey }}
- name: KUMIKI_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret }}
      key: {{ .Values.kafka.sasl.usernameKey }}
{{- else }}
- name: KUMIKI_KAFKA_SASL_USERNAME
  value: {{ .Values.kafka.sasl.username | quote }}
{{- end }}
- name: KUMIKI_KAFKA_SASL_PASSWORD_FILE
  value: /etc/kumiki/kafka-sasl/{{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if include "kumiki.kafkaTLS" . }}
- name: KUMIKI_KAFKA_SSL_CAFILE
  value: /etc/kumiki/kafka-tls/{{ .Values.kafka.tls.caKey }}
{{- if .Values.kafka.tls.clientCertificate }}
- name: KUMIKI_KAFKA_SSL_CERTFILE
  value: /etc/kumiki/kafka-tls/{{ .Values.kafka.tls.certKey }}
- name: KUMIKI_KAFKA_SSL_KEYFILE
  value: /etc/kumiki/kafka-tls/{{ .Values.kafka.tls.keyKey }}
{{- end }}
{{- end }}
- name: KUMIKI_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: KUMIKI_INSTANCE
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME
  value: /tmp
{{- end }}

{{/* Kafka secret volumes (name, secret, only the keys used). */}}
{{- define "kumiki.kafkaVolumes" -}}
{{- if include "kumiki.kafkaSASL" . }}
- name: kafka-sasl
  secret:
    secretName: {{ .Values.kafka.sasl.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.kafka.sasl.passwordKey }}
        path: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if include "kumiki.kafkaTLS" . }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.kafka.tls.caKey }}
        path: {{ .Values.kafka.tls.caKey }}
      {{- if .Values.kafka.tls.clientCertificate }}
      - key: {{ .Values.kafka.tls.certKey }}
        path: {{ .Values.kafka.tls.certKey }}
      - key: {{ .Values.kafka.tls.keyKey }}
        path: {{ .Values.kafka.tls.keyKey }}
      {{- end }}
{{- end }}
{{- end }}

{{- define "kumiki.kafkaVolumeMounts" -}}
{{- if include "kumiki.kafkaSASL" . }}
- name: kafka-sasl
  mountPath: /etc/kumiki/kafka-sasl
  readOnly: true
{{- end }}
{{- if include "kumiki.kafkaTLS" . }}
- name: kafka-tls
  mountPath: /etc/kumiki/kafka-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Plain extra env from a map; the schema refuses PASSWORD/TOKEN names, so no secret lands here. */}}
{{- define "kumiki.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
