package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// catenaBin is the catena executable built once by TestMain.
var catenaBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "catena-integration-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	catenaBin = filepath.Join(dir, "catena")
	cmd := exec.Command("go", "build", "-o", catenaBin, "github.com/catena-streams/catena/cmd/catena")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: building catena failed:", err)
		return 1
	}
	return m.Run()
}
