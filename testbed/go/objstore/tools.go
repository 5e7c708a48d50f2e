//go:build tools

// Package tools pins the command the testbed's object store builds from this module: the Versity S3
// Gateway (versitygw), served from a directory (its posix backend).
package tools

import (
	_ "github.com/versity/versitygw/cmd/versitygw"
)
