{{- define "fleetpulse.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetpulse.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "worker") */}}
{{- define "fleetpulse.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetpulse.componentLabels" -}}
{{ include "fleetpulse.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fleetpulse.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Kafka security mode: "sasl" when the protocol is SASL_*, "tls" when it carries TLS */}}
{{- define "fleetpulse.sasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}true{{ end -}}
{{- end -}}
{{- define "fleetpulse.tls" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end -}}
{{- end -}}

{{/* one component's Kafka principal, as YAML: (dict "root" $ "principal" "worker").
     Refuses an empty username or Secret with SASL: no component may borrow another's. */}}
{{- define "fleetpulse.principal" -}}
{{- $p := index .root.Values.kafka.principals .principal | default dict -}}
username: {{ required (printf "kafka.principals.%s.username is required with SASL" .principal) $p.username | quote }}
existingSecret: {{ required (printf "kafka.principals.%s.existingSecret is required with SASL" .principal) $p.existingSecret | quote }}
{{- end -}}

{{/* Refuse settings that would share or lose credentials: the values of an older chart (one
     account for every pod) and two components with one user or one Secret. */}}
{{- define "fleetpulse.checkPrincipals" -}}
{{- if or (hasKey .Values.kafka "saslUsername") (hasKey .Values.kafka "existingSecret") -}}
{{- fail "kafka.saslUsername and kafka.existingSecret are gone: every component has its own principal (kafka.principals.<component>.username / existingSecret) and the CA comes from kafka.caSecret; see values.yaml and deploy/kafka/README.md" -}}
{{- end -}}
{{- if include "fleetpulse.sasl" . -}}
{{- $users := dict -}}
{{- $secrets := dict -}}
{{- range $name, $p := .Values.kafka.principals -}}
{{- if hasKey $users (toString $p.username) -}}
{{- fail (printf "kafka.principals.%s and .%s share the user %q: every component needs its own" (get $users (toString $p.username)) $name $p.username) -}}
{{- end -}}
{{- if hasKey $secrets (toString $p.existingSecret) -}}
{{- fail (printf "kafka.principals.%s and .%s share the Secret %q: every component needs its own" (get $secrets (toString $p.existingSecret)) $name $p.existingSecret) -}}
{{- end -}}
{{- $_ := set $users (toString $p.username) $name -}}
{{- $_ := set $secrets (toString $p.existingSecret) $name -}}
{{- end -}}
{{- end -}}
{{- if and (include "fleetpulse.tls" .) (not .Values.kafka.caSecret) -}}
{{- fail (printf "kafka.caSecret is required with kafka.securityProtocol %s (the broker's CA)" .Values.kafka.securityProtocol) -}}
{{- end -}}
{{- end -}}

{{/* The environment every FleetPulse container shares: Kafka as the component's own principal
     (dict "root" $ "principal" "worker"; principal "" = a container that does not use Kafka
     and gets no Kafka settings at all), /metrics, the cluster. */}}
{{- define "fleetpulse.env" -}}
{{- $v := .root.Values -}}
{{- if .principal }}
- name: FLEETPULSE_KAFKA__BOOTSTRAP
  value: {{ $v.kafka.bootstrap | quote }}
- name: FLEETPULSE_KAFKA__TOPIC_PREFIX
  value: {{ $v.kafka.topicPrefix | quote }}
- name: FLEETPULSE_KAFKA__PARTITIONS
  value: {{ $v.kafka.partitions | quote }}
- name: FLEETPULSE_KAFKA__SECURITY_PROTOCOL
  value: {{ $v.kafka.securityProtocol | quote }}
{{- if include "fleetpulse.sasl" .root }}
{{- $p := include "fleetpulse.principal" . | fromYaml }}
- name: FLEETPULSE_KAFKA__SASL_MECHANISM
  value: {{ required "kafka.saslMechanism is required with SASL" $v.kafka.saslMechanism | quote }}
- name: FLEETPULSE_KAFKA__SASL_USERNAME
  value: {{ $p.username | quote }}
- name: FLEETPULSE_KAFKA__SASL_PASSWORD_FILE
  value: /etc/fleetpulse/kafka/{{ $v.kafka.saslPasswordKey }}
{{- end }}
{{- if include "fleetpulse.tls" .root }}
- name: FLEETPULSE_KAFKA__SSL_CAFILE
  value: /etc/fleetpulse/kafka-ca/{{ $v.kafka.caKey }}
{{- end }}
{{- end }}
- name: FLEETPULSE_METRICS__PORT
  value: {{ $v.metricsPort | quote }}
- name: FLEETPULSE_SOURCES__CLUSTER
  value: {{ $v.cluster | quote }}
- name: FLEETPULSE_KUBERNETES__CLUSTER
  value: {{ $v.cluster | quote }}
- name: FLEETPULSE_POLICY__DRY_RUN   # dryRun (default true): actions are logged, not carried out
  value: {{ $v.dryRun | quote }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* volumeMounts every container has: scratch space; its own principal's password and the
     broker CA (when secured and it uses Kafka). (dict "root" $ "principal" "worker") */}}
{{- define "fleetpulse.mounts" -}}
- name: work
  mountPath: /var/lib/fleetpulse
- name: tmp
  mountPath: /tmp
{{- if and .principal (include "fleetpulse.sasl" .root) }}
- name: kafka-principal
  mountPath: /etc/fleetpulse/kafka
  readOnly: true
{{- end }}
{{- if and .principal (include "fleetpulse.tls" .root) }}
- name: kafka-ca
  mountPath: /etc/fleetpulse/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "fleetpulse.volumes" -}}
{{- $v := .root.Values -}}
- name: work
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if and .principal (include "fleetpulse.sasl" .root) }}
{{- $p := include "fleetpulse.principal" . | fromYaml }}
- name: kafka-principal   # this component's password only: no pod holds another's
  secret:
    secretName: {{ $p.existingSecret }}
    defaultMode: 0440
    items:
      - {key: {{ $v.kafka.saslPasswordKey }}, path: {{ $v.kafka.saslPasswordKey }}}
{{- end }}
{{- if and .principal (include "fleetpulse.tls" .root) }}
- name: kafka-ca
  secret:
    secretName: {{ $v.kafka.caSecret }}
    defaultMode: 0444
    items:
      - {key: {{ $v.kafka.caKey }}, path: {{ $v.kafka.caKey }}}
{{- end }}
{{- end -}}

{{- define "fleetpulse.probes" -}}
ports:
  - name: metrics
    containerPort: {{ .Values.metricsPort }}
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 20
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: metrics}
  periodSeconds: 10
  failureThreshold: 3
startupProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 5
  failureThreshold: 60
{{- end -}}

{{/* the pod spec lines every FleetPulse pod shares */}}
{{- define "fleetpulse.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}


{{/* a container's resources, refused without a memory limit: (dict "name" "worker"
     "resources" .Values.worker.resources) */}}
{{- define "fleetpulse.resources" -}}
{{- $limits := .resources.limits | default dict -}}
{{- if not $limits.memory -}}
{{- fail (printf "%s.resources.limits.memory is required: every FleetPulse container has a memory limit" .name) -}}
{{- end -}}
{{- toYaml .resources -}}
{{- end -}}
