{{/* The picker's name, as in the original chart: <release>-epp. */}}
{{- define "slorouter.name" -}}
{{- $base := .Release.Name | default "default-pool" | lower | trim | trunc 40 -}}
{{ $base }}-epp
{{- end -}}

{{/* The InferencePool the picker follows (and the chart may create). */}}
{{- define "slorouter.poolName" -}}
{{- .Values.inferencePool.name | default .Release.Name -}}
{{- end -}}

{{- define "slorouter.labels" -}}
app.kubernetes.io/name: {{ include "slorouter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: slorouter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The picker pods' labels: `app` for `kubectl get pods -l app=<release>-epp`, `inferencepool` as the
original chart labels them. */}}
{{- define "slorouter.selectorLabels" -}}
app: {{ include "slorouter.name" . }}
inferencepool: {{ include "slorouter.name" . }}
{{- end -}}

{{/* registry/repository:tag of an image block, each empty field taken from inferenceExtension.image. */}}
{{- define "slorouter.image" -}}
{{- $main := .root.Values.inferenceExtension.image -}}
{{- $own := .image | default dict -}}
{{- $registry := $own.registry | default $main.registry -}}
{{- $repository := $own.repository | default $main.repository -}}
{{- $tag := $own.tag | default $main.tag | default .root.Chart.AppVersion -}}
{{- if not $repository -}}
{{- fail "inferenceExtension.image.repository is not set: no slorouter image is published. Build one from the repository's Dockerfile, push it, and set inferenceExtension.image.registry, inferenceExtension.image.repository and inferenceExtension.image.tag to it (docs/deploy.md, \"Installing, step by step\", step 1)" -}}
{{- end -}}
{{- if $registry -}}{{ $registry }}/{{ end -}}{{ $repository }}:{{ $tag }}
{{- end -}}

{{- define "slorouter.pullPolicy" -}}
{{- $own := .image | default dict -}}
{{- $own.pullPolicy | default .root.Values.inferenceExtension.image.pullPolicy | default "IfNotPresent" -}}
{{- end -}}

{{/* {name: value} → "--name", "value" list items. */}}
{{- define "slorouter.flags" -}}
{{- range $key, $value := . }}
- {{ printf "--%s" $key | quote }}
- {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* How many prediction servers: latencyPredictor.predictionServerCount (the GKE guide's name) when set,
else latencyPredictor.predictionServers.count. */}}
{{- define "slorouter.predictionServerCount" -}}
{{- $lp := .Values.inferenceExtension.latencyPredictor -}}
{{- $count := index $lp "predictionServerCount" -}}
{{- if kindIs "invalid" $count -}}{{- $count = $lp.predictionServers.count -}}{{- end -}}
{{- int $count -}}
{{- end -}}

{{- define "slorouter.predictionServerPorts" -}}
{{- $start := int .Values.inferenceExtension.latencyPredictor.predictionServers.startPort -}}
{{- range $i := until (int (include "slorouter.predictionServerCount" .)) }}{{ if $i }},{{ end }}{{ add $start $i }}{{ end -}}
{{- end -}}

{{/* The router's configuration (docs/configuration.md): the pool discovered from the InferencePool, the
predictor sidecars in remote mode, the objectives; then inferenceExtension.routerConfig over it. */}}
{{- define "slorouter.routerConfig" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $kubernetes := dict "namespace" .Release.Namespace "inference_pool" (include "slorouter.poolName" .) -}}
{{- $config := dict "pool" (dict "kubernetes" $kubernetes "model_server_type" .Values.inferencePool.modelServerType) -}}
{{- $enginePriority := .Values.inferencePool.enginePriority -}}
{{- if kindIs "map" $enginePriority -}}
{{- $_ := set $config.pool "engine_priority" (deepCopy $enginePriority) -}}
{{- else if $enginePriority -}}
{{- $_ := set $config.pool "engine_priority" true -}}
{{- end -}}
{{- if $ie.latencyPredictor.enabled -}}
{{- $lp := $ie.latencyPredictor -}}
{{- $urls := list -}}
{{- range $port := splitList "," (include "slorouter.predictionServerPorts" .) -}}
{{- $urls = append $urls (printf "http://127.0.0.1:%s" $port) -}}
{{- end -}}
{{- $remote := merge (deepCopy ($lp.remote | default dict)) (dict "training_server" (printf "http://127.0.0.1:%v" $lp.trainingServer.port) "prediction_servers" $urls "token_env" "SLOROUTER_PREDICTOR_TOKEN") -}}
{{- $_ := set $config "predictor" (dict "mode" "remote" "remote" $remote) -}}
{{- end -}}
{{- $plugins := get ($ie.pluginsCustomConfig | default dict) $ie.pluginsConfigFile -}}
{{- if $plugins -}}
{{- $_ := set $config "scheduler" (fromYaml $plugins) -}}
{{- end -}}
{{- if $ie.flowControl -}}
{{- $_ := set $config "flowControl" (deepCopy $ie.flowControl) -}}
{{- end -}}
{{- if $ie.tracing -}}
{{- $_ := set $config "tracing" (deepCopy $ie.tracing) -}}
{{- end -}}
{{- if $ie.tuning -}}
{{- $_ := set $config "tuning" (deepCopy $ie.tuning) -}}
{{- end -}}
{{- if .Values.inferenceObjectives -}}
{{- $objectives := dict -}}
{{- range .Values.inferenceObjectives -}}
{{- $objective := dict "priority" (int .priority) -}}
{{- if hasKey . "enginePriority" -}}
{{- $_ := set $objective "engine_priority" (int .enginePriority) -}}
{{- end -}}
{{- $_ := set $objectives .name $objective -}}
{{- end -}}
{{- $_ := set $config "objectives" $objectives -}}
{{- end -}}
{{- toYaml (mergeOverwrite $config (deepCopy ($ie.routerConfig | default dict))) -}}
{{- end -}}

{{/* Values the chart cannot honour are errors, not silently different behaviour. */}}
{{- define "slorouter.validate" -}}
{{- $pool := .Values.inferencePool -}}
{{- if ne $pool.apiVersion "inference.networking.k8s.io/v1" -}}
{{- fail (printf "inferencePool.apiVersion: only inference.networking.k8s.io/v1 is supported, not %q" $pool.apiVersion) -}}
{{- end -}}
{{- if not (has $pool.modelServerType (list "vllm" "sglang" "trtllm-serve" "triton-tensorrt-llm" "llamacpp" "tgi")) -}}
{{- fail (printf "inferencePool.modelServerType: slorouter reads vllm, sglang, trtllm-serve, triton-tensorrt-llm, llamacpp and tgi metrics, not %q" $pool.modelServerType) -}}
{{- end -}}
{{- $engine := $pool.enginePriority -}}
{{- $engineOn := false -}}
{{- $engineOrder := "" -}}
{{- if kindIs "map" $engine -}}
{{- $engineOn = ternary (index $engine "enabled") true (hasKey $engine "enabled") -}}
{{- $engineOrder = index $engine "order" | default "" -}}
{{- else -}}
{{- $engineOn = $engine -}}
{{- end -}}
{{- if and $engineOn (not $engineOrder) (not (has $pool.modelServerType (list "vllm" "sglang"))) -}}
{{- fail (printf "inferencePool.enginePriority: modelServerType %q takes no request priority (vllm and sglang do); set inferencePool.enginePriority.order for a server that takes an integer 'priority' body field" $pool.modelServerType) -}}
{{- end -}}
{{- if ne $pool.modelServerProtocol "http" -}}
{{- fail (printf "inferencePool.modelServerProtocol: only http is supported, not %q" $pool.modelServerProtocol) -}}
{{- end -}}
{{- if not (has .Values.provider.name (list "none" "gke" "istio")) -}}
{{- fail (printf "provider.name must be none, gke or istio, not %q" .Values.provider.name) -}}
{{- end -}}
{{- if not (has .Values.inferenceExtension.failureMode (list "FailOpen" "FailClose")) -}}
{{- fail (printf "inferenceExtension.failureMode must be FailOpen or FailClose, not %q" .Values.inferenceExtension.failureMode) -}}
{{- end -}}
{{- if or (lt (len $pool.targetPorts) 1) (gt (len $pool.targetPorts) 8) -}}
{{- fail "inferencePool.targetPorts: 1 to 8 ports" -}}
{{- end -}}
{{- $lp := .Values.inferenceExtension.latencyPredictor -}}
{{- $count := int (include "slorouter.predictionServerCount" .) -}}
{{- if and $lp.enabled (or (lt $count 1) (gt $count 16)) -}}
{{- fail (printf "inferenceExtension.latencyPredictor.predictionServerCount (or predictionServers.count): 1 to 16, not %v" $count) -}}
{{- end -}}
{{- range $probe := list "livenessProbe" "readinessProbe" -}}
{{- $port := index (index $lp.trainingServer $probe).httpGet "port" -}}
{{- if and (not (kindIs "invalid" $port)) (ne (int $port) (int $lp.trainingServer.port)) -}}
{{- fail (printf "inferenceExtension.latencyPredictor.trainingServer.%s.httpGet.port is %v, but the training server listens on trainingServer.port %v" $probe $port $lp.trainingServer.port) -}}
{{- end -}}
{{- end -}}
{{- if and $lp.token $lp.tokenSecret -}}
{{- fail "inferenceExtension.latencyPredictor: give token (the chart's Secret holds it) or tokenSecret (a Secret of your own), not both" -}}
{{- end -}}
{{- $persistence := $lp.persistence -}}
{{- if and $persistence.existingClaim (not $persistence.enabled) -}}
{{- fail "inferenceExtension.latencyPredictor.persistence.existingClaim is set but persistence.enabled is false: set enabled=true to use the claim" -}}
{{- end -}}
{{- if and $lp.enabled $persistence.enabled (gt (int .Values.inferenceExtension.replicas) 1) -}}
{{- fail (printf "inferenceExtension.latencyPredictor.persistence: one claim holds one training server's state, and replicas is %v; use persistence with one replica" .Values.inferenceExtension.replicas) -}}
{{- end -}}
{{- $plugins := .Values.inferenceExtension.pluginsCustomConfig | default dict -}}
{{- if and $plugins (not (hasKey $plugins .Values.inferenceExtension.pluginsConfigFile)) -}}
{{- fail (printf "inferenceExtension.pluginsCustomConfig has no entry %q (inferenceExtension.pluginsConfigFile)" .Values.inferenceExtension.pluginsConfigFile) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the predictor sidecars' token (key `token`). */}}
{{- define "slorouter.predictorTokenSecret" -}}
{{- .Values.inferenceExtension.latencyPredictor.tokenSecret | default (printf "%s-predictor-token" (include "slorouter.name" .)) -}}
{{- end -}}

{{/* The PersistentVolumeClaim of the predictor's state with persistence: existingClaim, or the chart's. */}}
{{- define "slorouter.predictorClaim" -}}
{{- .Values.inferenceExtension.latencyPredictor.persistence.existingClaim | default (printf "%s-predictor" (include "slorouter.name" .)) -}}
{{- end -}}

{{/* The env entry giving a container the predictor token. */}}
{{- define "slorouter.predictorTokenEnv" -}}
- name: SLOROUTER_PREDICTOR_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "slorouter.predictorTokenSecret" . }}
      key: token
{{- end -}}

{{/* The metrics scrapes the chart sets up (docs/deploy.md, "Monitoring"). Managed Prometheus (a
PodMonitoring) with monitoring.gke.enabled, or on provider gke with monitoring.prometheus.enabled; a
prometheus-operator ServiceMonitor with monitoring.prometheus.enabled elsewhere. */}}
{{- define "slorouter.monitoring.gmp" -}}
{{- $m := .Values.inferenceExtension.monitoring -}}
{{- if or $m.gke.enabled (and (eq .Values.provider.name "gke") $m.prometheus.enabled) }}true{{ end -}}
{{- end -}}

{{- define "slorouter.monitoring.serviceMonitor" -}}
{{- if and .Values.inferenceExtension.monitoring.prometheus.enabled (ne .Values.provider.name "gke") }}true{{ end -}}
{{- end -}}

{{/* Whether a scrape presents a ServiceAccount token (monitoring.prometheus.auth.enabled), and the names
of the reader identity's objects (the original's names). */}}
{{- define "slorouter.monitoring.auth" -}}
{{- if and .Values.inferenceExtension.monitoring.prometheus.auth.enabled (or (include "slorouter.monitoring.gmp" .) (include "slorouter.monitoring.serviceMonitor" .)) }}true{{ end -}}
{{- end -}}

{{- define "slorouter.metricsReader" -}}
{{- printf "%s-metrics-reader-sa" .Release.Name -}}
{{- end -}}

{{- define "slorouter.metricsReaderSecret" -}}
{{- printf "%s-metrics-reader-secret" .Release.Name -}}
{{- end -}}
