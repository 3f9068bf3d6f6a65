{{/* The labels every object carries (the kustomize base's part-of, and who manages it). */}}
{{- define "jitterscope.labels" -}}
app.kubernetes.io/part-of: jitterscope
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* jitterscope's settings as TOML: the ConfigMap's file, and (hashed) the pods' annotation that rolls them. */}}
{{- define "jitterscope.config" -}}
bootstrap_servers = {{ .Values.kafka.bootstrapServers | quote }}
kafka_partitions = {{ .Values.kafka.partitions }}
kafka_replication_factor = {{ .Values.kafka.replicationFactor }}
{{- if .Values.kafka.securityProtocol }}
kafka_security_protocol = {{ .Values.kafka.securityProtocol | quote }}
{{- end }}
{{- if .Values.kafka.saslMechanism }}
kafka_sasl_mechanism = {{ .Values.kafka.saslMechanism | quote }}
kafka_sasl_username = {{ .Values.kafka.saslUsername | quote }}
{{- end }}
{{- if .Values.kafka.existingSecret }}
kafka_sasl_password_file = "/etc/jitterscope/kafka/password"
kafka_ssl_ca_file = "/etc/jitterscope/kafka/ca.pem"
{{- end }}
{{- if .Values.clickhouse.cluster }}
clickhouse_cluster = {{ .Values.clickhouse.cluster | quote }}
{{- end }}
collector_metrics_port = {{ .Values.collector.metricsPort }}
streams_web_port = {{ .Values.streams.webPort }}
streams_web_bind = "0.0.0.0"
data_dir = "/var/lib/jitterscope"
{{ .Values.extraConfig }}
{{- end -}}

{{/* The streams containers' environment: the config, and the store's URL from its Secret. */}}
{{- define "jitterscope.streamsEnv" -}}
- name: JITTERSCOPE_CONFIG
  value: /etc/jitterscope/jitterscope.toml
- name: JITTERSCOPE_CLICKHOUSE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.clickhouse.existingSecret }}
      key: url
{{- end -}}

{{/* The streams containers' security context: nothing to escalate to, a read-only root. */}}
{{- define "jitterscope.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The streams containers' mounts: the config, Faust's scratch directory, and Kafka's secret where one is set. */}}
{{- define "jitterscope.streamsMounts" -}}
- name: config
  mountPath: /etc/jitterscope
  readOnly: true
- name: data
  mountPath: /var/lib/jitterscope
{{- if .Values.kafka.existingSecret }}
- name: kafka
  mountPath: /etc/jitterscope/kafka
  readOnly: true
{{- end }}
{{- end -}}
