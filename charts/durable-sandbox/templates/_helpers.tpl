{{/* Names, labels and the pieces several templates share. */}}

{{- define "durable-sandbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "durable-sandbox.fullname" -}}
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

{{- define "durable-sandbox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "durable-sandbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "durable-sandbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "durable-sandbox.labels" -}}
helm.sh/chart: {{ include "durable-sandbox.chart" . }}
{{ include "durable-sandbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: durable-sandbox
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "durable-sandbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "durable-sandbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "durable-sandbox.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The operator's permissions, the same rules for a ClusterRole (cluster-wide) or a Role per watched namespace. */}}
{{- define "durable-sandbox.rules" -}}
# Workflows and Sandboxes: watch them; patch metadata (the durable-sandbox.dev/cleanup finalizer) and delete
# finished Workflows (ttlSecondsAfterFinished). Spec writes are refused by the ValidatingAdmissionPolicy.
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflows", "sandboxes"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Workflows the operator creates: a run's child workflows, owned by their parent (kube/workflow/children.py), and
# the Workflows a WorkflowSchedule's ticks make, owned by the schedule (kube/schedule/).
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflows"]
  verbs: ["create"]
# Status goes through the status subresource only.
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflows/status", "sandboxes/status"]
  verbs: ["get", "patch", "update"]
# Owner references with blockOwnerDeletion on the Journal objects the operator owns.
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflows/finalizers", "sandboxes/finalizers"]
  verbs: ["update"]
# SandboxPools (warm Pods of the kubernetes provider): watch them, patch metadata (the cleanup finalizer and kopf's
# progress) and their status. The pool's Pods are made under the sandbox Pod rules below.
- apiGroups: ["durable-sandbox.dev"]
  resources: ["sandboxpools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["durable-sandbox.dev"]
  resources: ["sandboxpools/status"]
  verbs: ["get", "patch"]
# WorkflowSchedules: watch them, patch metadata (kopf's finalizer and progress) and their status; the Workflows
# their ticks make are owned by the schedule (blockOwnerDeletion needs its finalizers subresource).
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflowschedules"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflowschedules/status"]
  verbs: ["get", "patch"]
- apiGroups: ["durable-sandbox.dev"]
  resources: ["workflowschedules/finalizers"]
  verbs: ["update"]
# Everything the operator keeps of runs and Sandboxes (journal, leases, Sandbox state): objects of its own kind,
# which no namespace role grants, so no namespace user can change what it runs, believes or deletes. No
# ConfigMaps and no coordination.k8s.io Leases: those are everyone's (kube-system's leader elections too).
- apiGroups: ["durable-sandbox.dev"]
  resources: ["journals"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
# Lifecycle Events on Workflows and Sandboxes.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* The namespaces whose workflowSecrets the operator may read: never cluster-wide. */}}
{{- define "durable-sandbox.secretNamespaces" -}}
{{- if .Values.workflowSecrets }}
{{- $namespaces := .Values.workflowSecretNamespaces | default .Values.watchNamespaces }}
{{- if not $namespaces }}
{{- fail "workflowSecrets needs the namespaces where Workflows may use them: set watchNamespaces, or workflowSecretNamespaces when the operator watches every namespace (the chart never grants Secret reads cluster-wide: kube-system's included)" }}
{{- end }}
{{- toJson $namespaces }}
{{- else }}[]{{- end }}
{{- end }}

{{/* The Secret holding the journal key (in the release namespace). */}}
{{- define "durable-sandbox.journalKeySecret" -}}
{{- printf "%s-journal-key" (include "durable-sandbox.fullname" .) | trunc 253 }}
{{- end }}


{{- /* The kubernetes provider's rights: in a watched namespace's Role only, never in a ClusterRole. */}}
{{- define "durable-sandbox.sandboxPodRules" -}}
# Sandbox Pods: made, read (their state), watched (one new Pod by name, until it runs), annotated (the lease),
# listed (orphan sweeps, adoption), deleted.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Tool calls and snapshots: exec through the API server. The WebSocket's GET is authorized as get, and the
# upgrade to exec as create too (both are needed: tests/e2e/test_kubernetes_provider_apiserver.py).
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Each sandbox's env (it may hold secrets) in a Secret of its own, given to its Pod (ownerReferences), deleted
# with it. Never read back: no get, list or watch on Secrets comes from this.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch", "delete"]
# Templates a Workflow names as podtemplate/<name>.
- apiGroups: [""]
  resources: ["podtemplates"]
  verbs: ["get"]
{{- end }}

{{- /* The agent-sandbox provider's rights (providers.agentSandbox.enabled): in a watched namespace's Role only.
Nothing on SandboxTemplates or SandboxWarmPools (the platform team's), no update, no watch. */}}
{{- define "durable-sandbox.agentSandboxRules" -}}
# SandboxClaims: made (from a warm pool), read, patched (the lease's shutdownTime, the operator's seal), listed
# (orphan sweeps, adoption of its own sealed claims), deleted by uid (only claims it made and sealed).
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxclaims"]
  verbs: ["get", "list", "create", "patch", "delete"]
# The claim's Sandbox, read to follow claim -> Sandbox -> Pod and check the controller references.
- apiGroups: ["agents.x-k8s.io"]
  resources: ["sandboxes"]
  verbs: ["get"]
# The Sandbox's Pod: read (its uid, before and after every exec) and exec'd into (calls, snapshots).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["get", "create"]
{{- end }}

{{- /* Whether the agent-sandbox provider is on; enabled without watchNamespaces fails the install. */}}
{{- define "durable-sandbox.agentSandboxProvider" -}}
{{- if .Values.providers.agentSandbox.enabled }}
{{- if not .Values.watchNamespaces }}
{{- fail "providers.agentSandbox.enabled needs watchNamespaces: the chart grants SandboxClaims, Sandboxes, Pods and pods/exec only in watched namespaces, never cluster-wide" }}
{{- end }}true
{{- end }}
{{- end }}

{{- /* Whether the kubernetes provider is on: enabled, and namespaces to grant its rights in. */}}
{{- define "durable-sandbox.kubernetesProvider" -}}
{{- if and .Values.providers.kubernetes.enabled .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{- /* The provider of a Workflow or Sandbox that names none (dsb operator --default-provider). Unset: kubernetes when
the chart's kubernetes provider is on; else e2b with operator-wide credentials, local when allowed; else kubernetes,
which the operator then refuses per Workflow saying why it is off and what to set. A value the chart knows cannot
work here fails the install instead. */}}
{{- define "durable-sandbox.defaultProvider" -}}
{{- $kubernetes := include "durable-sandbox.kubernetesProvider" . -}}
{{- with .Values.defaultProvider -}}
{{- if and (eq . "kubernetes") (not $kubernetes) -}}
{{- fail "defaultProvider is kubernetes, but the chart's kubernetes provider is off: set watchNamespaces (and providers.kubernetes.enabled: true), or set defaultProvider to another provider" -}}
{{- end -}}
{{- if and (eq . "local") (not $.Values.allowLocalProvider) -}}
{{- fail "defaultProvider is local, which the operator refuses unless allowLocalProvider is true (development only: no isolation boundary)" -}}
{{- end -}}
{{- . -}}
{{- else -}}
{{- if $kubernetes }}kubernetes{{ else if $.Values.providers.e2b.existingSecret }}e2b{{ else if $.Values.allowLocalProvider }}local{{ else }}kubernetes{{ end -}}
{{- end -}}
{{- end }}

{{- /* The sandbox Pods' NetworkPolicy in each watched namespace (templates/networkpolicy.yaml). */}}
{{- define "durable-sandbox.networkPolicyName" -}}
{{- printf "%s-sandboxes" (include "durable-sandbox.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
