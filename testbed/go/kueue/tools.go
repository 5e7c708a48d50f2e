//go:build tools

// Package tools pins the command the testbed's Kueue mode builds from this module: Kueue's
// controller manager (its controllers and admission webhooks in one binary).
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
