// CoreDNS v1.15.0 with only the plugins the testbed's Corefile uses, registered in plugin.cfg's order: the
// way CoreDNS documents building it with a chosen plugin set (its default build links ~60 plugins and the
// cloud SDKs they need, ~13 minutes of compilation on 2 cores; this one is a fraction of that).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "cache", "kubernetes", "loop"}
}

func main() {
	coremain.Run()
}
