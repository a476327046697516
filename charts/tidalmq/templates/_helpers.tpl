{{/*
Names, labels and the values several templates share. Every object is named FULLNAME-<part>.
*/}}

{{- define "tidalmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tidalmq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tidalmq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "broker"). */}}
{{- define "tidalmq.labels" -}}
helm.sh/chart: {{ include "tidalmq.chart" .ctx }}
{{ include "tidalmq.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: tidalmq
{{- end }}

{{/* The labels that select a component's pods (never change them: selectors are immutable). */}}
{{- define "tidalmq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidalmq.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The broker pods' label selector as a string, for the operator (TIDALMQ_BROKER_SELECTOR). */}}
{{- define "tidalmq.brokerSelector" -}}
{{- printf "app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s,app.kubernetes.io/component=broker" (include "tidalmq.name" .) .Release.Name }}
{{- end }}

{{- define "tidalmq.brokerStatefulSet" -}}
{{- printf "%s-broker" (include "tidalmq.fullname" .) }}
{{- end }}

{{/* Headless Service: one DNS name per broker pod (the advertised host names). */}}
{{- define "tidalmq.brokerHeadlessService" -}}
{{- printf "%s-brokers" (include "tidalmq.fullname" .) }}
{{- end }}

{{/* ClusterIP Service clients bootstrap from. */}}
{{- define "tidalmq.bootstrapService" -}}
{{- printf "%s-bootstrap" (include "tidalmq.fullname" .) }}
{{- end }}

{{- define "tidalmq.operatorName" -}}
{{- printf "%s-operator" (include "tidalmq.fullname" .) }}
{{- end }}

{{- define "tidalmq.operatorServiceAccount" -}}
{{- default (include "tidalmq.operatorName" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "tidalmq.peeringName" -}}
{{- default (include "tidalmq.fullname" .) .Values.operator.peeringName }}
{{- end }}

{{/*
The security modes: listeners.tls.enabled, listeners.sasl.enabled and controlPlane.tls.enabled,
each true, false or auto (the default; docs/security.md, "Secure by default"). This is the one
place they are read: every template takes them from here. true and false always win. auto:
- at an upgrade: what the release runs, read (lookup) from its brokers' StatefulSet: the
  tidalmq.io/security-modes annotation this chart writes at every render, else (a release of a
  chart before auto) the broker container's environment (TIDALMQ_SSL_KEYSTORE_LOCATION: TLS,
  TIDALMQ_SASL_ENABLED_MECHANISMS: SASL, TIDALMQ_CONTROL_TLS_CERT_FILE: control-plane mTLS). So
  an upgrade never switches a running release's listener or control plane by itself;
- at a fresh install (no such StatefulSet, which is also what `helm template` and a client-side
  dry-run see: they have no cluster): on. The Kafka listener is then SASL_SSL (SCRAM-SHA-512),
  with ACLs enforced (authorization.authorizer auto), and the control plane speaks mTLS. Both
  listener switches must be auto for that: set one of them and the other's auto is off, as its
  default was before auto (listeners.tls.enabled=true alone is still the mTLS SSL listener).
JSON: {"controlTls": BOOL, "sasl": BOOL, "tls": BOOL} (include ... | fromJson).
*/}}
{{- define "tidalmq.securityModes" -}}
{{- $tls := toString .Values.listeners.tls.enabled }}
{{- $sasl := toString .Values.listeners.sasl.enabled }}
{{- $control := toString .Values.controlPlane.tls.enabled }}
{{- $running := dict }}
{{- if has "auto" (list $tls $sasl $control) }}
{{- $sts := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "tidalmq.brokerStatefulSet" .) }}
{{- if $sts }}
{{- $recorded := dig "metadata" "annotations" "tidalmq.io/security-modes" "" $sts | toString }}
{{- $parsed := dict }}
{{- if $recorded }}{{ $parsed = fromJson $recorded }}{{ end }}
{{- if and (hasKey $parsed "tls") (hasKey $parsed "sasl") (hasKey $parsed "controlTls") }}
{{- $running = $parsed }}
{{- else }}
{{- $env := dict }}
{{- range $c := dig "spec" "template" "spec" "containers" (list) $sts }}
{{- if eq $c.name "broker" }}
{{- range $e := $c.env }}{{ $_ := set $env $e.name true }}{{ end }}
{{- end }}
{{- end }}
{{- $running = dict "tls" (hasKey $env "TIDALMQ_SSL_KEYSTORE_LOCATION") "sasl" (hasKey $env "TIDALMQ_SASL_ENABLED_MECHANISMS") "controlTls" (hasKey $env "TIDALMQ_CONTROL_TLS_CERT_FILE") }}
{{- end }}
{{- end }}
{{- end }}
{{- $modes := dict }}
{{- if ne $tls "auto" }}{{ $_ := set $modes "tls" (eq $tls "true") }}
{{- else if $running }}{{ $_ := set $modes "tls" (index $running "tls") }}
{{- else }}{{ $_ := set $modes "tls" (eq $sasl "auto") }}
{{- end }}
{{- if ne $sasl "auto" }}{{ $_ := set $modes "sasl" (eq $sasl "true") }}
{{- else if $running }}{{ $_ := set $modes "sasl" (index $running "sasl") }}
{{- else }}{{ $_ := set $modes "sasl" (eq $tls "auto") }}
{{- end }}
{{- if ne $control "auto" }}{{ $_ := set $modes "controlTls" (eq $control "true") }}
{{- else if $running }}{{ $_ := set $modes "controlTls" (index $running "controlTls") }}
{{- else }}{{ $_ := set $modes "controlTls" true }}
{{- end }}
{{- $modes | toJson }}
{{- end }}

{{/* "true" when the Kafka listener has TLS (SSL or SASL_SSL), else "". */}}
{{- define "tidalmq.listenerTls" -}}
{{- if (include "tidalmq.securityModes" . | fromJson).tls }}true{{ end }}
{{- end }}

{{/* "true" when the Kafka listener has SASL (SASL_PLAINTEXT or SASL_SSL), else "". */}}
{{- define "tidalmq.listenerSasl" -}}
{{- if (include "tidalmq.securityModes" . | fromJson).sasl }}true{{ end }}
{{- end }}

{{/* "true" when the control plane speaks mTLS, else "". */}}
{{- define "tidalmq.controlTls" -}}
{{- if (include "tidalmq.securityModes" . | fromJson).controlTls }}true{{ end }}
{{- end }}

{{- define "tidalmq.controllerUrl" -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" (eq (include "tidalmq.controlTls" .) "true")) (include "tidalmq.operatorName" .) .Release.Namespace .Values.operator.ports.controller }}
{{- end }}

{{- define "tidalmq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "tidalmq.sparkImage" -}}
{{- printf "%s:%s" .Values.spark.image.repository (default .Chart.AppVersion .Values.spark.image.tag) }}
{{- end }}

{{- define "tidalmq.sparkServiceAccount" -}}
{{- printf "%s-spark" (include "tidalmq.fullname" .) }}
{{- end }}

{{- define "tidalmq.objectStoreName" -}}
{{- printf "%s-object-store" (include "tidalmq.fullname" .) }}
{{- end }}

{{/* S3 endpoint: the configured one, else the in-cluster server's Service when enabled. */}}
{{- define "tidalmq.objectStoreEndpoint" -}}
{{- if .Values.objectStore.endpoint }}
{{- .Values.objectStore.endpoint }}
{{- else if .Values.inClusterObjectStore.enabled }}
{{- printf "http://%s.%s.svc:%v" (include "tidalmq.objectStoreName" .) .Release.Namespace .Values.inClusterObjectStore.port }}
{{- end }}
{{- end }}

{{/* s3://BUCKET/PREFIX?endpoint_url=ENDPOINT&region=REGION (the TIDALMQ_STORAGE_URL). */}}
{{- define "tidalmq.storageUrl" -}}
{{- $os := .Values.objectStore }}
{{- $url := printf "s3://%s" $os.bucket }}
{{- with trimAll "/" $os.prefix }}
{{- $url = printf "%s/%s" $url . }}
{{- end }}
{{- $query := list }}
{{- with include "tidalmq.objectStoreEndpoint" . }}
{{- $query = append $query (printf "endpoint_url=%s" .) }}
{{- end }}
{{- with $os.region }}
{{- $query = append $query (printf "region=%s" .) }}
{{- end }}
{{- if $query }}
{{- $url = printf "%s?%s" $url (join "&" $query) }}
{{- end }}
{{- $url }}
{{- end }}

{{/* The metadata log's bucket ("" : the data bucket; see values.yaml metadataStore). */}}
{{- define "tidalmq.metadataBucket" -}}
{{- if .Values.metadataStore.bucket }}
{{- .Values.metadataStore.bucket }}
{{- else if and .Values.inClusterObjectStore.enabled (not .Values.objectStore.endpoint) }}
{{- "tidalmq-metadata" }}
{{- end }}
{{- end }}

{{/* s3://BUCKET/PREFIX?... of the metadata log (the TIDALMQ_METADATA_URL), or "" when it is the data bucket. */}}
{{- define "tidalmq.metadataUrl" -}}
{{- with include "tidalmq.metadataBucket" . }}
{{- $url := printf "s3://%s" . }}
{{- with trimAll "/" $.Values.metadataStore.prefix }}
{{- $url = printf "%s/%s" $url . }}
{{- end }}
{{- $query := list }}
{{- with include "tidalmq.objectStoreEndpoint" $ }}
{{- $query = append $query (printf "endpoint_url=%s" .) }}
{{- end }}
{{- with $.Values.objectStore.region }}
{{- $query = append $query (printf "region=%s" .) }}
{{- end }}
{{- if $query }}
{{- $url = printf "%s?%s" $url (join "&" $query) }}
{{- end }}
{{- $url }}
{{- end }}
{{- end }}

{{/*
Secret with the object-store credentials (keys access-key and secret-key), or "" when none are
passed: the existing Secret, else the chart's own (credentials in values, or the in-cluster
server's generated ones).
*/}}
{{- define "tidalmq.credentialsSecret" -}}
{{- if .Values.objectStore.existingSecret }}
{{- .Values.objectStore.existingSecret }}
{{- else if or .Values.inClusterObjectStore.enabled .Values.objectStore.accessKey }}
{{- include "tidalmq.objectStoreName" . }}
{{- end }}
{{- end }}

{{/*
The pods' checksum/object-store annotation: a hash of what decides the credentials the pods read
from the Secret, so that a pod template changes only when they do (never a render of the Secret
template, whose generated keys are random in every render that finds no stored Secret):
- objectStore.existingSecret: its name (after rotating the keys inside it, restart the pods);
- objectStore.accessKey/secretKey: the keys given in values;
- generated keys (in-cluster object store without keys in values): a constant, since they are
  generated once and kept across upgrades (lookup in object-store-secret.yaml);
- no credentials (pod identity): a constant.
The storage URL is hashed too (it is in the pods' environment anyway).
*/}}
{{- define "tidalmq.objectStoreChecksum" -}}
{{- $os := .Values.objectStore }}
{{- $credentials := "none" }}
{{- if $os.existingSecret }}
{{- $credentials = printf "existing-secret %s" $os.existingSecret }}
{{- else if $os.accessKey }}
{{- $credentials = printf "values %s %s" $os.accessKey $os.secretKey }}
{{- else if .Values.inClusterObjectStore.enabled }}
{{- $credentials = printf "generated once, kept in Secret %s" (include "tidalmq.objectStoreName" .) }}
{{- end }}
{{- list $credentials (include "tidalmq.storageUrl" .) | toJson | sha256sum }}
{{- end }}

{{/* The Secret of the control plane's tokens (keys admin-token and broker-secret). */}}
{{- define "tidalmq.controlSecret" -}}
{{- default (printf "%s-control" (include "tidalmq.fullname" .)) .Values.controlPlane.existingSecret }}
{{- end }}

{{/*
The pods' checksum/control-token annotation, like checksum/object-store: a hash of what decides
the tokens the pods read, never of the generated tokens (random in every render that finds no
stored Secret, and kept across upgrades once stored): the Secret's name, and whether it is the
chart's. Tokens rotated inside a Secret need a rolling restart (docs/security.md).
*/}}
{{- define "tidalmq.controlChecksum" -}}
{{- list "control-token" (include "tidalmq.controlSecret" .) (empty .Values.controlPlane.existingSecret) | toJson | sha256sum }}
{{- end }}

{{/* The control plane's certificates (controlPlane.tls): ca.crt, broker.*, operator.*. */}}
{{- define "tidalmq.controlTlsSecret" -}}
{{- default (printf "%s-control-tls" (include "tidalmq.fullname" .)) .Values.controlPlane.tls.existingSecret }}
{{- end }}

{{/* Where the pods find their control-plane certificate (tls.crt, tls.key) and its CA (ca.crt). */}}
{{- define "tidalmq.controlTlsDir" -}}
/etc/tidalmq/control-tls
{{- end }}

{{/*
A pod's control-plane mTLS: its environment (env), and its volume (volume; `role` broker or
operator: the pod mounts that role's certificate and key only, and the CA's certificate).
*/}}
{{- define "tidalmq.controlTlsEnv" -}}
{{- $dir := include "tidalmq.controlTlsDir" . }}
- name: TIDALMQ_CONTROL_TLS_CERT_FILE
  value: {{ printf "%s/tls.crt" $dir | quote }}
- name: TIDALMQ_CONTROL_TLS_KEY_FILE
  value: {{ printf "%s/tls.key" $dir | quote }}
- name: TIDALMQ_CONTROL_TLS_CA_FILE
  value: {{ printf "%s/ca.crt" $dir | quote }}
{{- if .Values.controlPlane.tls.crlSecret }}
# the control plane CA's CRL (controlPlane.tls.crlSecret): revoked certificates are refused on
# both sides; reloaded when the Secret changes
- name: TIDALMQ_CONTROL_TLS_CRL_FILE
  value: {{ printf "%s/crl.pem" (include "tidalmq.controlCrlDir" .) | quote }}
{{- end }}
{{- end }}

{{/* Where the pods find controlPlane.tls.crlSecret's crl.pem (its own volume: another Secret). */}}
{{- define "tidalmq.controlCrlDir" -}}
/etc/tidalmq/control-crl
{{- end }}

{{/*
The CRL's mount and volume (for controlPlane.tls.crlSecret): the whole Secret's crl.pem
(no subPath, so the kubelet updates it), not optional (a pod waits for the Secret rather than
start without the revocation it was told to check).
*/}}
{{- define "tidalmq.controlCrlMount" -}}
- name: control-crl
  mountPath: {{ include "tidalmq.controlCrlDir" . }}
  readOnly: true
{{- end }}

{{- define "tidalmq.controlCrlVolume" -}}
- name: control-crl
  secret:
    secretName: {{ .Values.controlPlane.tls.crlSecret }}
    defaultMode: 0444
    items:
      - key: crl.pem
        path: crl.pem
{{- end }}

{{- define "tidalmq.controlTlsVolume" -}}
- name: control-tls
  secret:
    secretName: {{ include "tidalmq.controlTlsSecret" .ctx }}
    defaultMode: 0440
    items:
      - key: ca.crt
        path: ca.crt
      - key: {{ .role }}.crt
        path: tls.crt
      - key: {{ .role }}.key
        path: tls.key
{{- end }}

{{/* Where the pods find the control tokens (a Secret volume). */}}
{{- define "tidalmq.controlTokenDir" -}}
/etc/tidalmq/control
{{- end }}

{{/* Environment shared by brokers and the operator: the object store. */}}
{{- define "tidalmq.storageEnv" -}}
- name: TIDALMQ_STORAGE_URL
  value: {{ include "tidalmq.storageUrl" . | quote }}
{{- with .Values.objectStore.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- with include "tidalmq.credentialsSecret" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: access-key
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: secret-key
{{- end }}
{{- end }}

{{/* Checks across values that the JSON schema cannot express. */}}
{{- define "tidalmq.validate" -}}
{{- if eq (include "tidalmq.metadataBucket" .) .Values.objectStore.bucket }}
{{- fail "metadataStore.bucket must differ from objectStore.bucket (leave it empty to keep the metadata log in the data bucket)" }}
{{- end }}
{{- if ge (int .Values.broker.drainTimeoutSeconds) (int .Values.broker.terminationGracePeriodSeconds) }}
{{- fail "broker.drainTimeoutSeconds must be below broker.terminationGracePeriodSeconds (the broker needs time to stop after draining)" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- if and .Values.objectStore.accessKey (not .Values.objectStore.secretKey) }}
{{- fail "objectStore.accessKey is set but objectStore.secretKey is empty" }}
{{- end }}
{{- if and .Values.objectStore.secretKey (not .Values.objectStore.accessKey) }}
{{- fail "objectStore.secretKey is set but objectStore.accessKey is empty" }}
{{- end }}
{{- if and .Values.objectStore.existingSecret .Values.objectStore.accessKey }}
{{- fail "set either objectStore.existingSecret or objectStore.accessKey/secretKey, not both" }}
{{- end }}
{{- if and .Values.controlPlane.tls.crlSecret (not (include "tidalmq.controlTls" .)) }}
{{- fail "controlPlane.tls.crlSecret needs control-plane mTLS (controlPlane.tls.enabled: true, or auto at a fresh install)" }}
{{- end }}
{{- end }}

{{/*
The security protocol of the brokers' Kafka listener (listeners.tls, listeners.sasl, resolved by
tidalmq.securityModes):
PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. The listener is named after its protocol.
*/}}
{{- define "tidalmq.kafkaProtocol" -}}
{{- $modes := include "tidalmq.securityModes" . | fromJson }}
{{- if and $modes.tls $modes.sasl }}SASL_SSL
{{- else if $modes.tls }}SSL
{{- else if $modes.sasl }}SASL_PLAINTEXT
{{- else }}PLAINTEXT
{{- end }}
{{- end }}

{{/* The Secret of the brokers' TLS certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "tidalmq.brokerTlsSecret" -}}
{{- default (printf "%s-broker-tls" (include "tidalmq.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/* The Secret of the clients CA (tls.crt, tls.key): tls Users' certificates, brokers' trust. */}}
{{- define "tidalmq.clientsCaSecret" -}}
{{- default (printf "%s-clients-ca" (include "tidalmq.fullname" .)) .Values.tls.clientsCaSecret }}
{{- end }}

{{/*
The Secret of the CRL the operator keeps of the clients CA (crl.pem; docs/security.md, "Revoked
tls Users' certificates"): with an SSL listener that asks for client certificates, Users on,
and no listeners.tls.crlSecret of the user's (which then wins). Empty otherwise.
*/}}
{{- define "tidalmq.clientsCrlSecret" -}}
{{- $l := .Values.listeners -}}
{{- if and (eq (include "tidalmq.kafkaProtocol" .) "SSL") (ne $l.tls.clientAuth "none") .Values.users.enabled (not $l.tls.crlSecret) -}}
{{- printf "%s-clients-crl" (include "tidalmq.fullname" .) }}
{{- end }}
{{- end }}

{{/* The CRL Secret the brokers mount: the user's listeners.tls.crlSecret or the operator's. */}}
{{- define "tidalmq.brokerCrlSecret" -}}
{{- default (include "tidalmq.clientsCrlSecret" .) .Values.listeners.tls.crlSecret }}
{{- end }}

{{/*
The DNS names of the brokers' generated certificate: each broker's advertised name (a wildcard
under the headless Service), the headless and bootstrap Services. Clients of broker.advertise
podIP reach brokers by IP, which no generated certificate names: use tls.existingSecret then.
*/}}
{{- define "tidalmq.brokerTlsNames" -}}
{{- $headless := include "tidalmq.brokerHeadlessService" . }}
{{- $bootstrap := include "tidalmq.bootstrapService" . }}
{{- $ns := .Release.Namespace }}
{{- $domain := .Values.clusterDomain }}
{{- list (printf "*.%s.%s.svc.%s" $headless $ns $domain) (printf "*.%s.%s.svc" $headless $ns)
    (printf "%s.%s.svc.%s" $headless $ns $domain) (printf "%s.%s.svc.%s" $bootstrap $ns $domain)
    (printf "%s.%s.svc" $bootstrap $ns) (printf "%s.%s" $bootstrap $ns) $bootstrap | toJson }}
{{- end }}

{{/* The bootstrap admin User (and its Secret): FULLNAME-admin. */}}
{{- define "tidalmq.adminUser" -}}
{{- printf "%s-admin" (include "tidalmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
"true" when the chart renders the bootstrap admin User (users.admin.enabled): only on a secured
listener with users.enabled; auto: at a fresh install (no brokers' StatefulSet found, as for
tidalmq.securityModes), or at an upgrade when the User exists already (so an upgrade never adds
an admin credential to a running release, and keeps the one a fresh install made).
*/}}
{{- define "tidalmq.adminUserOn" -}}
{{- $on := toString .Values.users.admin.enabled }}
{{- if and .Values.users.enabled (ne (include "tidalmq.kafkaProtocol" .) "PLAINTEXT") }}
{{- if eq $on "true" }}true
{{- else if eq $on "auto" }}
{{- $sts := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "tidalmq.brokerStatefulSet" .) }}
{{- if or (not $sts) (lookup "tidalmq.io/v1alpha1" "User" .Release.Namespace (include "tidalmq.adminUser" .)) }}true{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The planner's User (and its Secret) on a secured Kafka listener. */}}
{{- define "tidalmq.plannerUser" -}}
{{- printf "%s-planner" (include "tidalmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The bytes-in autoscaling pipeline (docs/autoscaling.md). The Prometheus the metrics adapter
queries: metricsAdapter.prometheusUrl, else the planner's operator.prometheusUrl (empty: none).
*/}}
{{- define "tidalmq.adapterPrometheusUrl" -}}
{{- default .Values.operator.prometheusUrl .Values.metricsAdapter.prometheusUrl }}
{{- end }}

{{/* "true" when the chart installs its metrics adapter: enabled and a Prometheus is known. */}}
{{- define "tidalmq.metricsAdapterOn" -}}
{{- if and .Values.metricsAdapter.enabled (include "tidalmq.adapterPrometheusUrl" .) }}true{{ end }}
{{- end }}

{{/*
"true" when the HPA scales on bytes-in: autoscaling.bytesIn.enabled true (an adapter serves the
metric, the chart's or one of your own), or "auto" and the chart installs its adapter.
*/}}
{{- define "tidalmq.bytesInAutoscaling" -}}
{{- $on := toString .Values.autoscaling.bytesIn.enabled }}
{{- if or (eq $on "true") (and (eq $on "auto") (include "tidalmq.metricsAdapterOn" .)) }}true{{ end }}
{{- end }}

{{- define "tidalmq.metricsAdapterName" -}}
{{- printf "%s-metrics-adapter" (include "tidalmq.fullname" .) }}
{{- end }}

{{/*
A cluster-scoped object of the adapter, named NAMESPACE-ADAPTER-SUFFIX (call with (dict "ctx" $
"suffix" "auth-reader")). Past 63 characters the name keeps its first 54 and a hash of the whole:
plain truncation made a long namespace's adapter names equal the operator's ClusterRole's.
*/}}
{{- define "tidalmq.metricsAdapterClusterName" -}}
{{- $name := printf "%s-%s" .ctx.Release.Namespace (include "tidalmq.metricsAdapterName" .ctx) }}
{{- if .suffix }}{{ $name = printf "%s-%s" $name .suffix }}{{ end }}
{{- if gt (len $name) 63 }}
{{- printf "%s-%s" ($name | trunc 54 | trimSuffix "-") ($name | sha256sum | trunc 8) }}
{{- else }}
{{- $name }}
{{- end }}
{{- end }}
