"""End-to-end tests against a local kwok cluster or the cluster in $KUBECONFIG (see hack/README.md)."""
