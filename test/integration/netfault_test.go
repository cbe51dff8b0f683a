package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// cgroupRoot is where the cgroup v2 hierarchy is mounted: the unified
// hierarchy of a hybrid layout (Debian 12 here), or the root itself.
func cgroupRoot(t testing.TB) string {
	t.Helper()
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), " "+dir+" ") &&
				strings.Contains(string(b), "cgroup2") {
				return dir
			}
		}
	}
	t.Fatalf("network faults need a cgroup v2 hierarchy (looked at /sys/fs/cgroup/unified and /sys/fs/cgroup)")
	return ""
}

// linkCutter cuts one direction of one link between two processes on
// loopback: the sender is moved into a cgroup of its own, and iptables
// drops what that cgroup sends to the receiver's listening port. Nothing
// else is touched: the master (the dev process), ingestion and the
// receiver's own connections to the sender go on. The drop is silent, as
// a partition is: no refusal. A socket keeps the cgroup it was created in,
// so the sender's open connections to the receiver are aborted at the cut
// (ss -K, on the sender's side only); those it opens again vanish.
// It needs root, iptables and ss, as the fault campaign does.
type linkCutter struct {
	t     testing.TB
	root  string
	group string // relative to root
	rules [][]string
	moved []int
}

func newLinkCutter(t testing.TB) *linkCutter {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("network faults need root (iptables, cgroups)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Fatalf("network faults need iptables: %v", err)
	}
	c := &linkCutter{t: t, root: cgroupRoot(t), group: fmt.Sprintf("catena-test-%d", os.Getpid())}
	if err := os.MkdirAll(filepath.Join(c.root, c.group), 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(c.close)
	return c
}

// cut drops what process pid sends to the listener at addr.
func (c *linkCutter) cut(pid int, addr string) {
	c.t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		c.t.Fatal(err)
	}
	sub := filepath.Join(c.group, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(c.root, sub), 0o755); err != nil {
		c.t.Fatalf("create cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(c.root, sub, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		c.t.Fatalf("move pid %d into cgroup %s: %v", pid, sub, err)
	}
	c.moved = append(c.moved, pid)
	rule := []string{"OUTPUT", "-p", "tcp", "-d", host, "--dport", port, "-m", "cgroup", "--path", sub, "-j", "DROP"}
	if out, err := exec.Command("iptables", append([]string{"-I"}, rule...)...).CombinedOutput(); err != nil {
		c.t.Fatalf("iptables -I %v: %v: %s", rule, err, out)
	}
	c.rules = append(c.rules, rule)
	// Abort the sender's connections to the receiver, made outside the
	// cgroup: ss -K on each of its local ports, so no one else's breaks.
	out, err := exec.Command("ss", "-tnpH", "state", "established", "dst", host, "dport", "= :"+port).CombinedOutput()
	if err != nil {
		c.t.Fatalf("ss: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 || !strings.Contains(line, fmt.Sprintf("pid=%d,", pid)) {
			continue
		}
		_, lport, err := net.SplitHostPort(fields[2])
		if err != nil {
			continue
		}
		if out, err := exec.Command("ss", "-K", "src", host, "sport", "= :"+lport, "dst", host, "dport", "= :"+port).CombinedOutput(); err != nil {
			c.t.Fatalf("ss -K of %s:%s -> %s: %v: %s", host, lport, addr, err, out)
		}
	}
}

// heal removes every cut; the processes stay where they are until close.
func (c *linkCutter) heal() {
	c.t.Helper()
	for _, rule := range c.rules {
		if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
			c.t.Errorf("iptables -D %v: %v: %s", rule, err, out)
		}
	}
	c.rules = nil
}

// close heals, moves the processes back to the root cgroup and removes
// the test's cgroups.
func (c *linkCutter) close() {
	c.heal()
	for _, pid := range c.moved {
		_ = os.WriteFile(filepath.Join(c.root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	entries, _ := os.ReadDir(filepath.Join(c.root, c.group))
	for _, e := range entries {
		if e.IsDir() {
			_ = os.Remove(filepath.Join(c.root, c.group, e.Name()))
		}
	}
	_ = os.Remove(filepath.Join(c.root, c.group))
}
