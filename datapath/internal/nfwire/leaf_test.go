package nfwire

import (
	"go/build"
	"strings"
	"testing"
)

// TestLeaf: the kernel's wire knows nothing of services, nor of anything
// else of Weir's: it imports no package of the module, so the datapath's
// decisions cannot leak into how messages are laid out.
func TestLeaf(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("no imports read")
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/weirlb/weir/") {
			t.Errorf("nfwire imports %s", imp)
		}
	}
}
