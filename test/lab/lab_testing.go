package lab

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// SkipUnlessPrivileged skips the test unless it runs as root with ip and nft
// available. With CI=true it fails instead: CI must never skip silently.
func SkipUnlessPrivileged(t testing.TB) {
	t.Helper()
	RequireRoot(t, "lab", "network namespaces", "ip", "nft")
}

// RequireRoot skips the test (fails it with CI=true) unless it runs as
// root with every tool in PATH; who and why name the test's needs in the
// message.
func RequireRoot(t testing.TB, who, why string, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" in PATH")
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := who + ": needs " + strings.Join(missing, ", ") + " (" + why + "); run as root, e.g. sudo -E go test"
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatal(msg + "; failing because CI=true")
	}
	t.Skip(msg)
}
