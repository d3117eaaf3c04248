{{/*
weir.checkKubeVersion refuses a cluster older than Kubernetes 1.31, whose
apiserver lacks the CEL IP and CIDR libraries the CRDs' rules use. Helm
renders without a cluster (helm template with no --kube-version) as for
its built-in default, v1.20.0: that version stands for "no cluster" and is
let through, so the chart renders offline with no flags. Any other version
below 1.31, a real cluster's (helm install, upgrade, template --validate)
or one given with --kube-version, is refused. Chart.yaml has no kubeVersion
for the same reason: Helm checks it against that default too.
*/}}
{{- define "weir.checkKubeVersion" -}}
{{- $v := .Capabilities.KubeVersion.Version -}}
{{- if and (ne $v "v1.20.0") (semverCompare "<1.31.0-0" $v) -}}
{{- fail (printf "Weir needs Kubernetes 1.31 or later (its CRDs' rules use CEL's IP and CIDR libraries); the cluster is %s" $v) -}}
{{- end -}}
{{- end -}}
