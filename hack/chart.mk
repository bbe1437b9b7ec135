# Helm chart, operator image and the kind end-to-end run (included by the Makefile).
# Uses HELM, KUBECTL, CLUSTER_KUBECONFIG and PY from the Makefile and hack/cluster.mk.

CHART := charts/gpu-operator
CHART_KUBE_VERSION ?= 1.36.0
IMAGE ?= gpu-operator:dev
# Server-side dry run against $KUBECONFIG when set, else the local kwok cluster when it is up.
CHART_KUBECONFIG = $(or $(KUBECONFIG),$(CLUSTER_KUBECONFIG))

.PHONY: chart-schema chart-lint image e2e-kind helm-path

helm-path: ## print the pinned helm's path (use with make -s)
	@echo $(HELM)

chart-schema: venv ## regenerate the chart's values.schema.json from the models
	$(PY) hack/values_schema.py --write

chart-lint: venv tools ## helm lint, schema freshness, and a server-side dry run when a cluster is up
	$(PY) hack/values_schema.py --check
	$(PY) hack/operand_rbac.py --check
	for crd in crds/*.yaml; do cmp $$crd $(CHART)/$$crd || exit 1; done
	$(HELM) lint --strict --kube-version $(CHART_KUBE_VERSION) $(CHART)
	$(HELM) template gpu-operator $(CHART) --namespace gpu-operator --kube-version $(CHART_KUBE_VERSION) >/dev/null
	@if [ -f "$(CHART_KUBECONFIG)" ] && $(KUBECTL) --kubeconfig "$(CHART_KUBECONFIG)" version >/dev/null 2>&1; then \
		echo "server-side dry run against $(CHART_KUBECONFIG)"; \
		extra=""; \
		if ! $(KUBECTL) --kubeconfig "$(CHART_KUBECONFIG)" get crd clusterpolicies.nvidia.com >/dev/null 2>&1; then \
			echo "(ClusterPolicy CRD not installed: dry run without the ClusterPolicy)"; \
			extra="--set clusterPolicy.create=false"; \
		fi; \
		$(HELM) template gpu-operator $(CHART) --namespace default --kube-version $(CHART_KUBE_VERSION) $$extra \
			| $(KUBECTL) --kubeconfig "$(CHART_KUBECONFIG)" apply --dry-run=server -f - ; \
	else \
		echo "no cluster up: skipped the server-side dry run (make cluster-up)"; \
	fi

image: ## build the operator image $(IMAGE) (needs docker)
	docker build -t $(IMAGE) .

e2e-kind: ## kind cluster + image + chart (operator in the cluster) + e2e tests, then delete the cluster (needs docker, kind)
	IMAGE=$(IMAGE) HELM=$(HELM) PYTHON=$(CURDIR)/$(PY) hack/kind-e2e.sh
