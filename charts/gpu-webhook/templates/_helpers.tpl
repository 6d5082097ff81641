{{/* The chart's name, or nameOverride. */}}
{{- define "gpu-webhook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of every object: the release name when it already contains the chart's name (`helm install
gpu-webhook ...` gives the same names as manifests/), else <release>-<chart>; or fullnameOverride. */}}
{{- define "gpu-webhook.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "gpu-webhook.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpu-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-webhook
{{- end }}

{{/* The server Pods' selector (also on the Deployment, Service and PDB). */}}
{{- define "gpu-webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{/* "true" when the server runs in the cluster (no webhook.url, mode not native): Deployment, Service, PDB,
ConfigMap, TLS. */}}
{{- define "gpu-webhook.inCluster" -}}
{{- if and (not .Values.webhook.url) (ne .Values.mode "native") }}true{{ end }}
{{- end }}

{{/* The params object of native and hybrid mode (a GPUClassMap), from native.params: a map (helm -f of the
`gpu-webhook policies render --format helm-values` file) or its YAML text (--set-file native.params=...). Fails,
naming the command to run, when it is missing or is not a GPUClassMap. Returns it as YAML. */}}
{{- define "gpu-webhook.nativeParams" -}}
{{- $params := .Values.native.params }}
{{- $render := printf "gpu-webhook policies render --rules <your rule directory> --mode %s --format helm-values > native-values.yaml, then pass -f native-values.yaml" .Values.mode }}
{{- if not $params }}
{{- fail (printf "mode=%s needs the params the rules compile to (the class table is computed by the rule engine, which a template cannot run): run %s" .Values.mode $render) }}
{{- end }}
{{- if kindIs "string" $params }}
{{- $params = fromYaml $params }}
{{- end }}
{{- if or (hasKey $params "Error") (ne (get $params "kind" | toString) "GPUClassMap") (not (get $params "spec")) }}
{{- fail (printf "native.params must be the GPUClassMap object that `gpu-webhook policies render` prints (kind GPUClassMap, with a spec); run %s" $render) }}
{{- end }}
{{- toYaml $params }}
{{- end }}

{{/* The Secret the server mounts at /etc/gpu-webhook/tls (tls.crt, tls.key, ca.crt). */}}
{{- define "gpu-webhook.tlsSecretName" -}}
{{- if and (eq .Values.certificates.mode "provided") .Values.certificates.provided.existingSecret }}
{{- .Values.certificates.provided.existingSecret }}
{{- else }}
{{- include "gpu-webhook.fullname" . }}-tls
{{- end }}
{{- end }}

{{/* The image reference: repository@digest, else repository:tag (tag defaults to the chart's appVersion). */}}
{{- define "gpu-webhook.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The DNS names the API server may use for the Service; <svc>.<ns>.svc is the one it verifies. */}}
{{- define "gpu-webhook.dnsNames" -}}
{{- $svc := include "gpu-webhook.fullname" . }}
{{- $ns := .Release.Namespace }}
- {{ $svc }}
- {{ $svc }}.{{ $ns }}
- {{ $svc }}.{{ $ns }}.svc
- {{ $svc }}.{{ $ns }}.svc.cluster.local
{{- end }}

{{/* Both webhooks' namespaceSelector: never the system namespaces nor the release's own, never opted out. */}}
{{- define "gpu-webhook.namespaceSelector" -}}
{{- $extra := .Values.webhook.namespaceSelector | default dict }}
{{- with $extra.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
  # Never the webhook's own namespace (it would gate its own Pods) nor the system namespaces.
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- range (concat .Values.webhook.excludedNamespaces (list .Release.Namespace) | uniq) }}
      - {{ . | quote }}
      {{- end }}
  {{- with .Values.webhook.optOutLabel }}
  # Opt-out label; only the platform team may label namespaces.
  - key: {{ . | quote }}
    operator: DoesNotExist
  {{- end }}
  {{- with $extra.matchExpressions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* What both webhooks share after clientConfig. */}}
{{- define "gpu-webhook.matchFields" -}}
namespaceSelector:
  {{- include "gpu-webhook.namespaceSelector" . | nindent 2 }}
{{- with .Values.webhook.objectSelector }}
objectSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchConditions:
  # Mirror Pods (static Pods seen through the API) are immutable copies; never touch them.
  - name: not-a-mirror-pod
    expression: "!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)"
{{- end }}

{{/* clientConfig for the path given as .path: the Service, or webhook.url; caBundle when known (.caBundle). */}}
{{- define "gpu-webhook.clientConfig" -}}
{{- $root := .root }}
{{- if $root.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "gpu-webhook.fullname" $root }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- end }}
{{- with .caBundle }}
caBundle: {{ . }}
{{- end }}
{{- end }}

{{/* "true" when .secret (a lookup result) carries an expiry annotation more than .renewBeforeDays away. */}}
{{- define "gpu-webhook.stillValid" -}}
{{- $s := .secret }}
{{- if and $s $s.data $s.metadata.annotations }}
{{- $notAfter := index $s.metadata.annotations "gpu-webhook.io/not-after" | default "0" | atoi }}
{{- if gt $notAfter (add (now | unixEpoch | atoi) (mul (int .renewBeforeDays) 86400)) }}true{{ end }}
{{- end }}
{{- end }}
