{{/* Names, labels and the pieces every daemon pod shares. */}}

{{- define "kvferry.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector of one role: (dict "root" $ "role" "prefill") */}}
{{- define "kvferry.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "kvferry.modelsClaim" -}}
{{- if .Values.model.volume.create -}}
{{ .Release.Name }}-models
{{- else -}}
{{ required "model.volume.existingClaim is needed when model.volume.create is false" .Values.model.volume.existingClaim }}
{{- end -}}
{{- end -}}

{{- define "kvferry.daemonImage" -}}
{{- if .Values.gpu.enabled -}}
{{ .Values.image.cuda.repository }}:{{ .Values.image.cuda.tag }}
{{- else -}}
{{ .Values.image.cpu.repository }}:{{ .Values.image.cpu.tag }}
{{- end -}}
{{- end -}}

{{/* A daemon's --device: with gpu.enabled, gpu.device (its pod's GPUs count from 0). */}}
{{- define "kvferry.deviceArgs" -}}
{{- if .Values.gpu.enabled -}}
--device {{ .Values.gpu.device }}
{{- end -}}
{{- end -}}

{{/* The key flags of a pod: its key id is its engine id (the pod name), or "proxy". */}}
{{- define "kvferry.authArgs" -}}
{{- if .Values.keys.insecure -}}
--insecure
{{- else -}}
--keys /etc/kvferry/keys
{{- end -}}
{{- end -}}

{{/*
The endpoints the proxy serves from, one per line: one stable DNS name per
StatefulSet ordinal up to maxReplicas (pod.service, resolved in the pod's
namespace through its DNS search path), so scaling a StatefulSet within
maxReplicas changes nothing in the proxy. ZeroMQ resolves a name at every
connect attempt; a pod that does not exist is an instance the proxy reports
unhealthy and never routes to. The list is a ConfigMap file the proxy reads
(--prefill-file, --decode-file): no length limit; at most 64 per role.
(dict "root" $ "role" "prefill" "v" $.Values.prefill)
*/}}
{{- define "kvferry.endpoints" -}}
{{- $name := printf "%s-%s" .root.Release.Name .role -}}
{{- if gt (int .v.maxReplicas) 64 -}}
{{- fail (printf "%s.maxReplicas %d: the proxy serves at most 64 instances of a role" .role (int .v.maxReplicas)) -}}
{{- end -}}
{{- range $i := until (int .v.maxReplicas) }}
tcp://{{ $name }}-{{ $i }}.{{ $name }}:{{ int $.v.controlPort }}
{{- end -}}
{{- end -}}

{{/* Pod-level settings every workload shares: runtime and priority class. */}}
{{- define "kvferry.podClasses" -}}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Environment of a daemon container. */}}
{{- define "kvferry.daemonEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: KVF_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.rdma.enabled }}
- name: UCX_NET_DEVICES
  value: {{ .Values.rdma.ucxNetDevices | quote }}
{{- end }}
{{- if .Values.rdma.ucxTls }}
- name: UCX_TLS
  value: {{ .Values.rdma.ucxTls | quote }}
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Resources of a daemon: the role's own plus a GPU per TP rank and the RDMA device. (dict "root" $ "v" $.Values.prefill) */}}
{{- define "kvferry.daemonResources" -}}
{{- $limits := or .root.Values.gpu.enabled .root.Values.rdma.enabled .v.resources.limits -}}
{{- with .v.resources.requests }}
requests:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $limits }}
limits:
  {{- with .v.resources.limits }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- if .root.Values.gpu.enabled }}
  {{ .root.Values.gpu.resource }}: {{ .v.tp }}
  {{- end }}
  {{- if .root.Values.rdma.enabled }}
  {{ .root.Values.rdma.resource }}: {{ .root.Values.rdma.count }}
  {{- end }}
{{- end }}
{{- if not (or .v.resources.requests $limits) }}
{}
{{- end }}
{{- end -}}

{{/* A daemon container's security context: IPC_LOCK for RDMA memory registration. */}}
{{- define "kvferry.daemonSecurity" -}}
allowPrivilegeEscalation: false
{{- if .Values.rdma.enabled }}
# capabilities added to a non-root container do not reach its process: root for IPC_LOCK
runAsUser: 0
capabilities:
  add: [IPC_LOCK]
{{- end }}
{{- end -}}

{{- define "kvferry.daemonVolumes" -}}
- name: models
  persistentVolumeClaim:
    claimName: {{ include "kvferry.modelsClaim" . }}
    readOnly: true
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSizeLimit }}
{{- if not .Values.keys.insecure }}
- name: keys
  secret:
    secretName: {{ .Values.keys.secretName }}
    defaultMode: 288   # 0440: the pod's fsGroup reads it
{{- end }}
{{- end -}}

{{- define "kvferry.daemonMounts" -}}
- {name: models, mountPath: {{ .Values.model.mountPath }}, readOnly: true}
- {name: shm, mountPath: /dev/shm}
{{- if not .Values.keys.insecure }}
- {name: keys, mountPath: /etc/kvferry/keys, readOnly: true}
{{- end }}
{{- end -}}

{{/* startup, readiness and liveness probes of a daemon: GET /health on its metrics port
(503 while the model loads, after SIGTERM, once its TP world broke, or when its loop is
stuck); a probe given in the role's probes replaces the default.
(dict "v" $.Values.prefill) */}}
{{- define "kvferry.daemonProbes" -}}
startupProbe:
{{- with .v.probes.startup }}
  {{- toYaml . | nindent 2 }}
{{- else }}
  httpGet: {path: /health, port: metrics}
  periodSeconds: 5
  failureThreshold: {{ div .v.startupSeconds 5 }}
{{- end }}
readinessProbe:
{{- with .v.probes.readiness }}
  {{- toYaml . | nindent 2 }}
{{- else }}
  httpGet: {path: /health, port: metrics}
  periodSeconds: 5
  failureThreshold: 2
{{- end }}
livenessProbe:
{{- with .v.probes.liveness }}
  {{- toYaml . | nindent 2 }}
{{- else }}
  httpGet: {path: /health, port: metrics}
  periodSeconds: 10
  failureThreshold: 6
{{- end }}
{{- end -}}
