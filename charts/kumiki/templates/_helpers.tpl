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
{{- $saslUsers := .Values.kafka.sasl.users | default dict }}
{{- if include "kumiki.kafkaSASL" . }}
{{- range $role := include "kumiki.kafkaRoles" . | fromJsonArray }}
{{- $own := index $saslUsers $role }}
{{- if and $own (not $own.existingSecret) (not $.Values.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.sasl.users.%s.existingSecret: required with kafka.securityProtocol=%s when kafka.sasl.existingSecret is empty (a Secret holding %s's SASL password)" $role $.Values.kafka.securityProtocol $role) }}
{{- end }}
{{- if and (not $own) (not $.Values.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.sasl.existingSecret: required with kafka.securityProtocol=%s (a Secret holding the SASL password)" $.Values.kafka.securityProtocol) }}
{{- end }}
{{- if and (not $own) (not $.Values.kafka.sasl.username) (not $.Values.kafka.sasl.usernameKey) }}
{{- fail (printf "kafka.sasl.username: required with SASL (or kafka.sasl.usernameKey naming a key of kafka.sasl.existingSecret, or kafka.sasl.users.%s.username)" $role) }}
{{- end }}
{{- end }}
{{- else if $saslUsers }}
{{- fail "kafka.sasl.users: needs kafka.securityProtocol SASL_PLAINTEXT or SASL_SSL" }}
{{- end }}
{{- $acls := .Values.kafka.acls }}
{{- if $acls.apply }}
{{- if not (include "kumiki.kafkaSASL" .) }}
{{- fail "kafka.acls.apply: needs kafka.securityProtocol SASL_PLAINTEXT or SASL_SSL (the Job authenticates as the broker's admin)" }}
{{- end }}
{{- if not $acls.adminUsername }}
{{- fail "kafka.acls.adminUsername: required with kafka.acls.apply (a super user of the broker, which the ACL Job runs as)" }}
{{- end }}
{{- if not $acls.adminSecret }}
{{- fail "kafka.acls.adminSecret: required with kafka.acls.apply (a Secret whose kafka.acls.adminPasswordKey holds the admin's SASL password)" }}
{{- end }}
{{- if and (not (include "kumiki.kafkaRoles" . | fromJsonArray)) (not $acls.subscriberUser) }}
{{- fail "kafka.acls.apply: no Kafka user to grant: the services, binder and agent are all disabled and kafka.acls.subscriberUser is empty" }}
{{- end }}
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

{{/*
The Kafka roles this release runs (kumiki.common.bus.access role names), as a JSON list: the enabled services,
the binder and the agent.
*/}}
{{- define "kumiki.kafkaRoles" -}}
{{- $roles := list }}
{{- $catalog := include "kumiki.catalog" . | fromYaml }}
{{- range $key := list "placement" "quota" "forecast" "preemption" "telemetryIngest" }}
{{- if (index $.Values.services $key).enabled }}
{{- $roles = append $roles (index $catalog $key).name }}
{{- end }}
{{- end }}
{{- if .Values.binder.enabled }}{{ $roles = append $roles "binder" }}{{ end }}
{{- if .Values.agent.enabled }}{{ $roles = append $roles "agent" }}{{ end }}
{{- toJson $roles }}
{{- end }}

{{/*
The SASL user of one role, as JSON {username, usernameKey, existingSecret, passwordKey}. Context: dict "root"
(the chart's root context) and "role" (a kumiki.common.bus.access role name, or "admin": the ACL Job's user).
A role listed in kafka.sasl.users runs as its own user (its Secret and key default to the shared ones); any
other role runs as the shared user, kafka.sasl.username or usernameKey.
*/}}
{{- define "kumiki.kafkaUser" -}}
{{- $sasl := .root.Values.kafka.sasl }}
{{- $own := index ($sasl.users | default dict) .role }}
{{- if eq .role "admin" }}
{{- $acls := .root.Values.kafka.acls }}
{{- dict "username" $acls.adminUsername "usernameKey" "" "existingSecret" $acls.adminSecret "passwordKey" $acls.adminPasswordKey | toJson }}
{{- else if $own }}
{{- dict "username" $own.username "usernameKey" "" "existingSecret" ($own.existingSecret | default $sasl.existingSecret) "passwordKey" ($own.passwordKey | default $sasl.passwordKey) | toJson }}
{{- else }}
{{- dict "username" $sasl.username "usernameKey" $sasl.usernameKey "existingSecret" $sasl.existingSecret "passwordKey" $sasl.passwordKey | toJson }}
{{- end }}
{{- end }}

{{/*
Every Secret the Kafka users of this release read, for NOTES.txt: one "- name: key K = what, ..." line per
Secret, in the order the pods first name them ("" in $who: the shared user; "admin": the ACL Job).
*/}}
{{- define "kumiki.kafkaSecretLines" -}}
{{- $root := . }}
{{- $roles := include "kumiki.kafkaRoles" . | fromJsonArray }}
{{- if .Values.kafka.acls.apply }}{{ $roles = append $roles "admin" }}{{ end }}
{{- $users := .Values.kafka.sasl.users | default dict }}
{{- $secrets := list }}
{{- $keys := dict }}
{{- $who := dict }}
{{- $usernameKeyOf := dict }}
{{- range $role := $roles }}
{{- $user := include "kumiki.kafkaUser" (dict "root" $root "role" $role) | fromJson }}
{{- $shared := and (ne $role "admin") (not (hasKey $users $role)) }}
{{- if not (has $user.existingSecret $secrets) }}
{{- $secrets = append $secrets $user.existingSecret }}
{{- $_ := set $keys $user.existingSecret list }}
{{- end }}
{{- $slot := printf "%s/%s" $user.existingSecret $user.passwordKey }}
{{- if not (hasKey $who $slot) }}
{{- $_ := set $keys $user.existingSecret (append (get $keys $user.existingSecret) $user.passwordKey) }}
{{- $_ := set $who $slot list }}
{{- end }}
{{- $_ := set $who $slot (append (get $who $slot) (ternary "" $role $shared)) }}
{{- if and $shared $user.usernameKey }}{{ $_ := set $usernameKeyOf $user.existingSecret $user.usernameKey }}{{ end }}
{{- end }}
{{- range $secret := $secrets }}
{{- $parts := list }}
{{- range $key := get $keys $secret }}
{{- $holders := get $who (printf "%s/%s" $secret $key) }}
{{- $named := without $holders "" "admin" }}
{{- $what := list }}
{{- if has "" $holders }}{{ $what = append $what "Kafka SASL password" }}{{ end }}
{{- if $named }}{{ $what = append $what (printf "Kafka SASL password of %s" (join ", " $named)) }}{{ end }}
{{- if has "admin" $holders }}{{ $what = append $what "the Kafka admin's password (the kafka-acls Job)" }}{{ end }}
{{- $parts = append $parts (printf "key %s = %s" $key (join "; " $what)) }}
{{- end }}
{{- with get $usernameKeyOf $secret }}{{ $parts = append $parts (printf "key %s = its username" .) }}{{ end }}
{{ printf "- %s: %s" $secret (join ", " $parts) }}
{{- end }}
{{- end }}

{{/*
Kafka settings shared by the services, the agent and the ACL Job. Context: dict "root" and "role" (see
kumiki.kafkaUser): the role picks the SASL user.
*/}}
{{- define "kumiki.kafkaEnv" -}}
{{- $user := include "kumiki.kafkaUser" . | fromJson }}
{{- with .root -}}
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
{{- if $user.usernameKey }}
- name: KUMIKI_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $user.existingSecret }}
      key: {{ $user.usernameKey }}
{{- else }}
- name: KUMIKI_KAFKA_SASL_USERNAME
  value: {{ $user.username | quote }}
{{- end }}
- name: KUMIKI_KAFKA_SASL_PASSWORD_FILE
  value: /etc/kumiki/kafka-sasl/{{ $user.passwordKey }}
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
{{- end }}

{{/* Kafka secret volumes (name, secret, only the keys used). Context: dict "root" and "role". */}}
{{- define "kumiki.kafkaVolumes" -}}
{{- $user := include "kumiki.kafkaUser" . | fromJson }}
{{- with .root }}
{{- if include "kumiki.kafkaSASL" . }}
- name: kafka-sasl
  secret:
    secretName: {{ $user.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $user.passwordKey }}
        path: {{ $user.passwordKey }}
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
{{- end }}

{{/* Context: dict "root" and "role", as kumiki.kafkaVolumes. */}}
{{- define "kumiki.kafkaVolumeMounts" -}}
{{- with .root }}
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
{{- end }}

{{/* Plain extra env from a map; the schema refuses PASSWORD/TOKEN names, so no secret lands here. */}}
{{- define "kumiki.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
