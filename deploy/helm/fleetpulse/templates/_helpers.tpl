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

{{/* the environment every FleetPulse container shares: Kafka, its security, /metrics */}}
{{- define "fleetpulse.env" -}}
- name: FLEETPULSE_KAFKA__BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: FLEETPULSE_KAFKA__TOPIC_PREFIX
  value: {{ .Values.kafka.topicPrefix | quote }}
- name: FLEETPULSE_KAFKA__PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
- name: FLEETPULSE_KAFKA__SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
- name: FLEETPULSE_KAFKA__SASL_MECHANISM
  value: {{ required "kafka.saslMechanism is required with SASL" .Values.kafka.saslMechanism | quote }}
- name: FLEETPULSE_KAFKA__SASL_USERNAME
  value: {{ required "kafka.saslUsername is required with SASL" .Values.kafka.saslUsername | quote }}
- name: FLEETPULSE_KAFKA__SASL_PASSWORD_FILE
  value: /etc/fleetpulse/kafka/{{ .Values.kafka.saslPasswordKey }}
{{- end }}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}
- name: FLEETPULSE_KAFKA__SSL_CAFILE
  value: /etc/fleetpulse/kafka/{{ .Values.kafka.caKey }}
{{- end }}
- name: FLEETPULSE_METRICS__PORT
  value: {{ .Values.metricsPort | quote }}
- name: FLEETPULSE_SOURCES__CLUSTER
  value: {{ .Values.cluster | quote }}
- name: FLEETPULSE_KUBERNETES__CLUSTER
  value: {{ .Values.cluster | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "fleetpulse.secure" -}}
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" -}}
{{- required "kafka.existingSecret is required when kafka.securityProtocol is not PLAINTEXT" .Values.kafka.existingSecret | trunc 0 -}}
true
{{- end -}}
{{- end -}}

{{/* volumeMounts every container has: the Kafka Secret (when secured), scratch space */}}
{{- define "fleetpulse.mounts" -}}
- name: work
  mountPath: /var/lib/fleetpulse
- name: tmp
  mountPath: /tmp
{{- if include "fleetpulse.secure" . }}
- name: kafka-secret
  mountPath: /etc/fleetpulse/kafka
  readOnly: true
{{- end }}
{{- end -}}

{{- define "fleetpulse.volumes" -}}
- name: work
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if include "fleetpulse.secure" . }}
- name: kafka-secret
  secret:
    secretName: {{ .Values.kafka.existingSecret }}
    defaultMode: 0440
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
