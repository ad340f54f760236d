{{/*
An image reference from {repository, tag, digest}: the digest wins; a tag alone, else the
chart's appVersion. Fails on neither being usable.
*/}}
{{- define "agent-sandbox.image" -}}
{{- $image := .image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .appVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret the router's credential comes from. */}}
{{- define "agent-sandbox.routerSecret" -}}
{{- if .Values.router.auth.existingSecret -}}
{{- .Values.router.auth.existingSecret -}}
{{- else if eq .Values.router.auth.mode "token" -}}
sandbox-router-token
{{- else -}}
sandbox-router-signing-key
{{- end -}}
{{- end -}}

{{/* The key in that Secret. */}}
{{- define "agent-sandbox.routerSecretKey" -}}
{{- if eq .Values.router.auth.mode "token" -}}token{{- else -}}key{{- end -}}
{{- end -}}

{{/* The one namespace a namespaced router (router.scope=namespace) watches. */}}
{{- define "agent-sandbox.routerWatchNamespace" -}}
{{- default .Values.sandboxes.namespace .Values.router.watchNamespace -}}
{{- end -}}
