{{/*
weir.kubernetesAPIEnv: the environment that points client-go's in-cluster
configuration at kubernetesAPI (HOST:PORT, [IPv6]:PORT) instead of the
kubernetes Service, for a cluster whose only service proxy is Weir.
*/}}
{{- define "weir.kubernetesAPIEnv" -}}
{{- with .Values.kubernetesAPI -}}
{{- $port := regexFind "[0-9]+$" . -}}
{{- $host := trimSuffix (printf ":%s" $port) . | trimPrefix "[" | trimSuffix "]" -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ $host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $port | quote }}
{{- end -}}
{{- end -}}
