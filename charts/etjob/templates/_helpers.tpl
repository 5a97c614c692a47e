{{/* The image reference of a component: by digest when one is set, else by tag (default: the chart's appVersion). */}}
{{- define "etjob.image" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end -}}
{{- end -}}

