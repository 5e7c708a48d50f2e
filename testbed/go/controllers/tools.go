//go:build tools

// Package tools pins the commands the testbed builds from this module.
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
