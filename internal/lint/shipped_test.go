package lint_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestShippedCodeLinksNoTestMachinery: what users run (the pgreorder command, the examples) and
// every library package are built without the testing package and without internal/pgtest and
// internal/kafkatest, the test helpers. Only those may link them; the commands start servers
// through internal/pgserver.
func TestShippedCodeLinksNoTestMachinery(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Deps " "}}`, mod+"...").Output()
	require.NoError(t, err)
	const pgtest = mod + "internal/pgtest"
	const kafkatest = mod + "internal/kafkatest"
	checked := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ":")
		if pkg == pgtest || pkg == kafkatest {
			continue
		}
		checked[strings.TrimPrefix(pkg, mod)] = true
		for _, dep := range strings.Fields(deps) {
			if dep == "testing" || strings.HasPrefix(dep, "testing/") || dep == pgtest || dep == kafkatest {
				t.Errorf("%s links %s (go list -deps %s)", pkg, dep, pkg)
			}
		}
	}
	for _, pkg := range []string{"cmd/pgreorder", "internal/pgserver", "reorderbuffer", "replication"} {
		require.True(t, checked[pkg], "package %s not listed", pkg)
	}
}
