# trainflow e2e testbed targets; included from the top-level Makefile.
# Env: TRAINFLOW_TESTBED_DIR (run dir, default /tmp/trainflow-testbed),
#      TRAINFLOW_TESTBED_CACHE (build cache, default ~/.cache/trainflow-testbed),
#      TRAINFLOW_TESTBED_PORT_BASE (first of 10 loopback ports, default 26380).
TESTBED_MK_DIR := $(dir $(lastword $(MAKEFILE_LIST)))

.PHONY: testbed-build testbed-up testbed-down testbed-status testbed-logs

testbed-build:
	bash $(TESTBED_MK_DIR)build.sh

testbed-up:
	bash $(TESTBED_MK_DIR)up.sh

testbed-down:
	bash $(TESTBED_MK_DIR)down.sh

testbed-status:
	bash $(TESTBED_MK_DIR)status.sh

testbed-logs:
	bash $(TESTBED_MK_DIR)status.sh --logs
