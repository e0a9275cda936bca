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

{{- define "slorouter.predictionServerPorts" -}}
{{- $servers := .Values.inferenceExtension.latencyPredictor.predictionServers -}}
{{- range $i := until (int $servers.count) }}{{ if $i }},{{ end }}{{ add (int $servers.startPort) $i }}{{ end -}}
{{- end -}}

{{/* The router's configuration (docs/configuration.md): the pool discovered from the InferencePool, the
predictor sidecars in remote mode, the objectives; then inferenceExtension.routerConfig over it. */}}
{{- define "slorouter.routerConfig" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $config := dict "pool" (dict "kubernetes" (dict "namespace" .Release.Namespace "inference_pool" (include "slorouter.poolName" .))) -}}
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
{{- if .Values.inferenceObjectives -}}
{{- $objectives := dict -}}
{{- range .Values.inferenceObjectives -}}
{{- $_ := set $objectives .name (dict "priority" (int .priority)) -}}
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
{{- if not (has $pool.modelServerType (list "vllm" "sglang")) -}}
{{- fail (printf "inferencePool.modelServerType: slorouter reads vllm and sglang metrics, not %q" $pool.modelServerType) -}}
{{- end -}}
{{- if ne $pool.modelServerProtocol "http" -}}
{{- fail (printf "inferencePool.modelServerProtocol: only http is supported, not %q" $pool.modelServerProtocol) -}}
{{- end -}}
{{- if ne .Values.provider.name "none" -}}
{{- fail (printf "provider.name: only \"none\" is supported (gateway resources are not part of this chart), not %q" .Values.provider.name) -}}
{{- end -}}
{{- if not (has .Values.inferenceExtension.failureMode (list "FailOpen" "FailClose")) -}}
{{- fail (printf "inferenceExtension.failureMode must be FailOpen or FailClose, not %q" .Values.inferenceExtension.failureMode) -}}
{{- end -}}
{{- if or (lt (len $pool.targetPorts) 1) (gt (len $pool.targetPorts) 8) -}}
{{- fail "inferencePool.targetPorts: 1 to 8 ports" -}}
{{- end -}}
{{- $lp := .Values.inferenceExtension.latencyPredictor -}}
{{- if and $lp.enabled (or (lt (int $lp.predictionServers.count) 1) (gt (int $lp.predictionServers.count) 16)) -}}
{{- fail (printf "inferenceExtension.latencyPredictor.predictionServers.count: 1 to 16, not %v" $lp.predictionServers.count) -}}
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

{{/* The env entry giving a container the predictor token. */}}
{{- define "slorouter.predictorTokenEnv" -}}
- name: SLOROUTER_PREDICTOR_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "slorouter.predictorTokenSecret" . }}
      key: token
{{- end -}}
