package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// catenaBin is the catena executable built once by TestMain, and
// catenaPowerLossBin the same built with the powerloss tag: its replicas
// keep unsynced writes in memory, so a SIGKILL loses them as a power cut
// would (replica/partlog/lazyfs).
var catenaBin, catenaPowerLossBin string

// catenactlBin is the client CLI, built once by TestMain.
var catenactlBin string

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
	catenaPowerLossBin = filepath.Join(dir, "catena-powerloss")
	for bin, tags := range map[string]string{catenaBin: "", catenaPowerLossBin: "powerloss"} {
		cmd := exec.Command("go", "build", "-tags", tags, "-o", bin, "github.com/catena-streams/catena/cmd/catena")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "integration: building %s failed: %v\n", bin, err)
			return 1
		}
	}
	catenactlBin = filepath.Join(dir, "catenactl")
	cmd := exec.Command("go", "build", "-o", catenactlBin, "github.com/catena-streams/catena/cmd/catenactl")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: building %s failed: %v\n", catenactlBin, err)
		return 1
	}
	return m.Run()
}
