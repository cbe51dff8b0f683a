package integration

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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
//
// It also slows links (slow): iptables redirects what the sender sends to
// the receiver to a delay line in the test process, which passes each
// chunk on after a fixed delay, as a congested or long link would.
type linkCutter struct {
	t     testing.TB
	root  string
	group string // relative to root
	rules []iptRule
	moved []int
	lines []*delayLine
}

type iptRule struct {
	table string // "" is filter
	spec  []string
}

func (r iptRule) args(op string) []string {
	var a []string
	if r.table != "" {
		a = append(a, "-t", r.table)
	}
	return append(append(a, op), r.spec...)
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
	host, port := c.split(addr)
	sub := c.enter(pid)
	c.insert(iptRule{spec: []string{"OUTPUT", "-p", "tcp", "-d", host, "--dport", port, "-m", "cgroup", "--path", sub, "-j", "DROP"}})
	c.abort(pid, host, port)
}

// slow delays by delay everything process pid sends to the listener at
// addr (its answers come back at once): its connections there are
// redirected to a delay line that forwards to addr.
func (c *linkCutter) slow(pid int, addr string, delay time.Duration) {
	c.t.Helper()
	host, port := c.split(addr)
	dl := startDelayLine(c.t, addr, delay)
	c.lines = append(c.lines, dl)
	sub := c.enter(pid)
	c.insert(iptRule{table: "nat", spec: []string{"OUTPUT", "-p", "tcp", "-d", host, "--dport", port, "-m", "cgroup", "--path", sub,
		"-j", "REDIRECT", "--to-ports", strconv.Itoa(dl.port)}})
	c.abort(pid, host, port)
}

func (c *linkCutter) split(addr string) (host, port string) {
	c.t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		c.t.Fatal(err)
	}
	return host, port
}

// enter moves pid into a cgroup of its own and returns its path.
func (c *linkCutter) enter(pid int) string {
	c.t.Helper()
	sub := filepath.Join(c.group, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(c.root, sub), 0o755); err != nil {
		c.t.Fatalf("create cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(c.root, sub, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		c.t.Fatalf("move pid %d into cgroup %s: %v", pid, sub, err)
	}
	c.moved = append(c.moved, pid)
	return sub
}

func (c *linkCutter) insert(r iptRule) {
	c.t.Helper()
	if out, err := exec.Command("iptables", r.args("-I")...).CombinedOutput(); err != nil {
		c.t.Fatalf("iptables %v: %v: %s", r.args("-I"), err, out)
	}
	c.rules = append(c.rules, r)
}

// abort ends pid's connections to host:port, made outside the cgroup: ss
// -K on each of its local ports, so no one else's break.
func (c *linkCutter) abort(pid int, host, port string) {
	c.t.Helper()
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
			c.t.Fatalf("ss -K of %s:%s -> %s:%s: %v: %s", host, lport, host, port, err, out)
		}
	}
}

// heal removes every cut; the processes stay where they are until close.
func (c *linkCutter) heal() {
	c.t.Helper()
	for _, rule := range c.rules {
		if out, err := exec.Command("iptables", rule.args("-D")...).CombinedOutput(); err != nil {
			c.t.Errorf("iptables %v: %v: %s", rule.args("-D"), err, out)
		}
	}
	c.rules = nil
	// Closing a delay line ends the connections through it; their senders
	// dial again, directly now.
	for _, dl := range c.lines {
		dl.close()
	}
	c.lines = nil
}

// delayLine accepts connections and forwards each to target, passing on
// what the client sends delay after it arrived (a delay, not a rate
// limit: chunks follow one another as they came) and the answers at once.
type delayLine struct {
	lis   net.Listener
	port  int
	delay time.Duration
	mu    sync.Mutex
	conns []net.Conn
}

func startDelayLine(t testing.TB, target string, delay time.Duration) *delayLine {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dl := &delayLine{lis: lis, port: lis.Addr().(*net.TCPAddr).Port, delay: delay}
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			dl.mu.Lock()
			dl.conns = append(dl.conns, in, out)
			dl.mu.Unlock()
			go dl.forward(in, out)
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return dl
}

func (dl *delayLine) forward(in, out net.Conn) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 64<<10)
			n, err := in.Read(b)
			if n > 0 {
				q <- chunk{time.Now(), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range q {
		if wait := time.Until(ch.at.Add(dl.delay)); wait > 0 {
			<-time.After(wait) // the delay is the fault itself
		}
		if _, err := out.Write(ch.b); err != nil {
			break
		}
	}
	out.Close()
}

func (dl *delayLine) close() {
	dl.lis.Close()
	dl.mu.Lock()
	defer dl.mu.Unlock()
	for _, c := range dl.conns {
		c.Close()
	}
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
