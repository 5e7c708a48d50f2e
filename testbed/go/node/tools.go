//go:build tools

// Package tools pins the node commands the testbed's pods mode builds from this module:
// the kubelet and kube-proxy of the same Kubernetes release as the control plane.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
